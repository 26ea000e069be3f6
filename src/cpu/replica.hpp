#pragma once
// The CPU replica of the network (include/mnist_mt/replica.hpp) on one CPU device.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "device.hpp"
#include "mnist_mt/replica.hpp"

namespace mnist_mt::cpu {

// What runs one operation of the step: oneDNN's implementation name(s) (impl_info_str,
// e.g. "jit:avx2", with " + reorder ..." for weight reorders) or "own:<isa>".
struct KernelInfo {
  std::string op;
  std::string impl;
};

// Compute-thread time of one operation since the last take_profile().
struct OpTime {
  std::string op;
  std::string impl;  // of the plan used last
  double seconds = 0;
};

class CpuReplica : public Replica {
 public:
  // Every operation of the plan for `batch` (built now if it is not yet), in step order.
  virtual std::vector<KernelInfo> kernels(std::uint32_t batch) = 0;
  // Waits for the device; returns each operation's time since the last call and resets it.
  virtual std::vector<OpTime> take_profile() = 0;
};

// Whether an implementation string names one of oneDNN's reference (unoptimised)
// implementations: a word "ref" or "ref_..." (as in "ref:any", "gemm:ref"). Defined
// in plan.cpp.
bool is_reference(std::string_view impl);

// Builds the oneDNN primitives for batch `max_batch` on the device's compute stream
// (oneDNN chooses kernels for the thread count it runs with) and waits for them.
// Parameters, gradients and the optimizer state start at zero. Warns once per process on stderr
// when a plan runs a reference implementation.
// With `bf16`, fc1's and fc2's products read bfloat16 operands (Precision::kBf16); where
// not bf16_products(), its first plan throws.
std::unique_ptr<CpuReplica> make_cpu_replica(CpuDevice& device, std::uint32_t max_batch, bool bf16 = false);

}  // namespace mnist_mt::cpu
