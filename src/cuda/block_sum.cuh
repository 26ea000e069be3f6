#pragma once
// Sum over a block of kBlock threads in a fixed tree order, so the result does not depend
// on timing: reductions stay bitwise reproducible from run to run.
#include "launch.cuh"

namespace mnist_mt::cuda {

// Every thread of the block must call it; the total is returned to thread 0.
template <typename T>
__device__ T block_sum(T value, T* shared /* kBlock elements */) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int half = kBlock / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

}  // namespace mnist_mt::cuda
