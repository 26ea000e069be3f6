#pragma once
// The cuDNN/cuBLAS replica of the network (include/mnist_mt/replica.hpp) on one GPU.
#include <cstdint>
#include <memory>

#include "device.hpp"
#include "mnist_mt/backend.hpp"
#include "mnist_mt/replica.hpp"

namespace mnist_mt::cuda {

// On the thread that drives `device`. Times the cuDNN algorithms for `max_batch`, takes
// every byte of device memory the replica will use, and runs one step on zeros so every
// kernel is loaded before training starts. Parameters, gradients and momentum start at
// zero.
std::unique_ptr<Replica> make_cuda_replica(CudaDevice& device, std::uint32_t max_batch, const BackendOptions& options);

}  // namespace mnist_mt::cuda
