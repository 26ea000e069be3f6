// The CPU backend: a device per core, the in-process communicator, the oneDNN replica.
#include "mnist_mt/backend.hpp"

#include <sched.h>

#include <algorithm>
#include <cerrno>

#include "communicator.hpp"
#include "device.hpp"
#include "isa.hpp"
#include "plan.hpp"
#include "mnist_mt/error.hpp"
#include "replica.hpp"

namespace mnist_mt {
namespace {

cpu::CpuDevice& cpu_device(Device& device) {
  auto* d = dynamic_cast<cpu::CpuDevice*>(&device);
  if (d == nullptr) throw RuntimeFailure(device.name() + " is not a CPU device");
  return *d;
}

// The CPU path is deterministic as it is: of BackendOptions only pin_cpu_threads and
// precision apply.
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options)
      : pin_(options.pin_cpu_threads), bf16_(options.precision == Precision::kBf16) {
    if (bf16_ && !cpu::bf16_products())
      throw InputError("bf16 needs AVX512_BF16 or AMX: " + cpu::no_bf16_products() + "; use fp32", "precision");
  }
  std::string name() const override { return "cpu"; }
  // The CPUs this thread may run on (taskset's, a container's), not every online one.
  int device_count() const override { return std::max(1, static_cast<int>(cpu_mask().size())); }

  std::vector<std::unique_ptr<Device>> make_devices(std::span<const int> ids) override {
    const std::vector<int> cores = pin_ ? cpu_cores_for(ids.size()) : std::vector<int>{};
    std::vector<std::unique_ptr<Device>> devices;
    for (std::size_t i = 0; i < ids.size(); ++i)
      devices.push_back(std::make_unique<cpu::CpuDevice>(ids[i], cores.empty() ? std::nullopt : std::optional(cores[i])));
    return devices;
  }

  std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<Device* const> devices,
                                                                const Place& place) override {
    std::vector<cpu::CpuDevice*> cpus;
    for (Device* d : devices) cpus.push_back(&cpu_device(*d));
    return cpu::make_communicators(cpus, place);
  }

  bool sums_shards() const override { return true; }
  // fc1's factor product is float32: with bf16 products the gradient is exchanged.
  bool exchanges_factors() const override { return !bf16_; }
  Precision precision() const override { return bf16_ ? Precision::kBf16 : Precision::kFp32; }
  std::uint64_t host_bytes_per_sample() const override { return cpu::Buffers::bytes_per_sample(bf16_); }
  std::unique_ptr<Replica> make_replica(Device& device, std::uint32_t max_batch) override {
    return cpu::make_cpu_replica(cpu_device(device), max_batch, bf16_);
  }

 private:
  const bool pin_;
  const bool bf16_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) { return std::make_unique<CpuBackend>(options); }

std::vector<int> cpu_mask() {
  // A set as large as the kernel's: EINVAL until it holds every CPU the kernel counts.
  for (std::size_t cpus = CPU_SETSIZE; cpus <= (std::size_t{1} << 20); cpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) return {};
    const std::size_t size = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(size, set);
    const int got = sched_getaffinity(0, size, set);
    const int error = got == 0 ? 0 : errno;
    std::vector<int> mask;
    if (got == 0)
      for (std::size_t c = 0; c < cpus; ++c)
        if (CPU_ISSET_S(c, size, set)) mask.push_back(static_cast<int>(c));
    CPU_FREE(set);
    if (error != EINVAL) return mask;
  }
  return {};
}

std::vector<int> cpu_cores_for(std::size_t devices) {
  std::vector<int> cpus = cpu_mask();
  if (cpus.size() != devices) return {};
  return cpus;
}

}  // namespace mnist_mt
