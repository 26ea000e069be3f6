// The CPU backend: a device per core, the in-process communicator, the oneDNN replica.
#include "mnist_mt/backend.hpp"

#include <algorithm>
#include <thread>

#include "communicator.hpp"
#include "device.hpp"
#include "mnist_mt/error.hpp"
#include "replica.hpp"

namespace mnist_mt {
namespace {

cpu::CpuDevice& cpu_device(Device& device) {
  auto* d = dynamic_cast<cpu::CpuDevice*>(&device);
  if (d == nullptr) throw RuntimeFailure(device.name() + " is not a CPU device");
  return *d;
}

// The CPU path is deterministic as it is, so BackendOptions change nothing here.
class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  int device_count() const override { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

  std::vector<std::unique_ptr<Device>> make_devices(std::span<const int> ids) override {
    std::vector<std::unique_ptr<Device>> devices;
    for (int id : ids) devices.push_back(std::make_unique<cpu::CpuDevice>(id));
    return devices;
  }

  std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<Device* const> devices,
                                                                const Place& place) override {
    std::vector<cpu::CpuDevice*> cpus;
    for (Device* d : devices) cpus.push_back(&cpu_device(*d));
    return cpu::make_communicators(cpus, place);
  }

  bool sums_shards() const override { return true; }
  std::unique_ptr<Replica> make_replica(Device& device, std::uint32_t max_batch) override {
    return cpu::make_cpu_replica(cpu_device(device), max_batch);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions&) { return std::make_unique<CpuBackend>(); }

}  // namespace mnist_mt
