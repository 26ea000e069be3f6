#pragma once
// What the trainer needs from a kind of device: CPU (oneDNN, always built) or CUDA.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mnist_mt/communicator.hpp"
#include "mnist_mt/device.hpp"
#include "mnist_mt/processes.hpp"
#include "mnist_mt/replica.hpp"

namespace mnist_mt {

// The number format of the network's products (--precision). kBf16: CPU devices whose oneDNN
// has bf16 kernels (AVX512_BF16 or AMX) multiply fc1's and fc2's operands rounded to
// bfloat16, accumulating and writing float32; weights, loss, reductions and the update
// stay float32 (docs/cli.md).
enum class Precision { kFp32, kBf16 };
// The value of --precision, as --metrics, eval's JSON and the messages write it: tf32 is
// fp32 with TF32 tensor cores allowed in cuDNN and cuBLAS (BackendOptions::tf32, GPUs).
constexpr const char* precision_name(bool bf16, bool tf32 = false) { return bf16 ? "bf16" : tf32 ? "tf32" : "fp32"; }

struct BackendOptions {
  Precision precision = Precision::kFp32;
  bool deterministic = false;  // CUDA: deterministic cuDNN algorithms only
  bool tf32 = false;           // CUDA: allow TF32 in cuBLAS/cuDNN
  bool cuda_graphs = true;     // CUDA: a DDP step is recorded once as a graph and replayed
  bool device_data = true;     // CUDA: the run's images and labels held in device memory (Replica::hold_data)
  // CPU: device i's compute and comm threads run on the i-th CPU of cpu_cores_for(), so
  // that a rank's allreduce shares its own core, not a peer's.
  bool pin_cpu_threads = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  // Devices present (CPU: the CPUs of cpu_mask()).
  virtual int device_count() const = 0;
  // Main thread. `ids` are checked by the caller (distinct, < device_count()).
  virtual std::vector<std::unique_ptr<Device>> make_devices(std::span<const int> ids) = 0;
  // Main thread, one communicator per device, world rank place.first_rank + i on
  // devices[i]: in one process ncclCommInitAll; with several (place.processes),
  // ncclCommInitRank, or the CPU's hierarchical allreduce. Every process calls it.
  virtual std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<Device* const> devices,
                                                                        const Place& place = {}) = 0;
  // On the thread that will drive it, after device.activate(). Weights are zero until
  // written.
  virtual std::unique_ptr<Replica> make_replica(Device& device, std::uint32_t max_batch) = 0;
  // Whether a rank can compute several shards of the world's batch in turn with the
  // sums of a world of a rank per shard, bit for bit (Place::shards,
  // Communicator::allreduce_shards, Replica::keep_grads): CPU devices, whose allreduce
  // adds in rank order.
  virtual bool sums_shards() const { return false; }
  // Whether its replicas and communicators exchange fc1's factors (Replica::exchange_factors,
  // Communicator::allgather).
  virtual bool exchanges_factors() const { return false; }
  // The number format of its replicas' products (BackendOptions::precision).
  virtual Precision precision() const { return Precision::kFp32; }
  // Host memory a replica's activation buffers take per sample of its batch: CPU devices
  // hold them in host memory; 0 where they are elsewhere (GPUs).
  virtual std::uint64_t host_bytes_per_sample() const { return 0; }
  // Whether cuDNN and cuBLAS may use TF32 tensor cores (BackendOptions::tf32; GPUs only).
  virtual bool tf32() const { return false; }
  // Bracket collectives for several ranks issued from one thread (ncclGroupStart/End).
  virtual void group_start() {}
  virtual void group_end() {}
};

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);
// Throws InputError when the build has no CUDA.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
bool cuda_built();
// The CPUs the calling thread may run on (its affinity mask: the process's as it started,
// e.g. taskset's or a container's, unless the thread changed it), in order.
std::vector<int> cpu_mask();
// The CPUs a CPU backend with BackendOptions::pin_cpu_threads pins `devices` devices to,
// device i to the i-th: cpu_mask() when it holds exactly one CPU per device; otherwise
// none (empty): a run that uses part of the CPUs it may use claims none of them, so
// that another run beside it is not crowded onto the same ones.
std::vector<int> cpu_cores_for(std::size_t devices);

}  // namespace mnist_mt
