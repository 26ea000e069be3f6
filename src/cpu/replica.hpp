#pragma once
// The oneDNN replica of the network (include/mnist_mt/replica.hpp) on one CPU device.
#include <cstdint>
#include <memory>

#include "device.hpp"
#include "mnist_mt/replica.hpp"

namespace mnist_mt::cpu {

// Builds the oneDNN primitives for batch `max_batch` on the device's compute stream
// (oneDNN chooses kernels for the thread count it runs with) and waits for them.
// Parameters, gradients and momentum start at zero.
std::unique_ptr<Replica> make_cpu_replica(CpuDevice& device, std::uint32_t max_batch);

}  // namespace mnist_mt::cpu
