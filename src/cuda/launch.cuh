#pragma once
// What every kernel file shares: the block size, the grid for a grid-stride loop, and
// the check after each launch (a bad configuration fails at its call site; execution
// errors surface at the next synchronisation).
#include <algorithm>
#include <cstddef>

#include "errors.hpp"

namespace mnist_mt::cuda {

inline constexpr int kBlock = 256;

inline unsigned grid_for(std::size_t count) {
  return static_cast<unsigned>(std::min<std::size_t>((count + kBlock - 1) / kBlock, std::size_t{1} << 16));
}

__device__ __forceinline__ std::size_t global_thread() {
  return std::size_t{blockIdx.x} * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_threads() { return std::size_t{gridDim.x} * blockDim.x; }

}  // namespace mnist_mt::cuda

#define CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
