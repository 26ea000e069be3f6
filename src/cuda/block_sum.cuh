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

// The block's sum of one float a thread in block_tree_sum's order (element_ops.hpp):
// each warp's by halving, then the warps' totals in warp order; returned to thread 0.
// Every thread of the block must call it; blockDim.x is a multiple of 32, at most kBlock.
__device__ inline float block_tree_sum(float value, float* warps /* blockDim.x / 32 elements, shared */) {
  for (int h = 16; h > 0; h /= 2) value += __shfl_down_sync(0xffffffffu, value, h);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x == 0) {
    total = warps[0];
    for (unsigned w = 1; w < blockDim.x / 32; ++w) total += warps[w];
  }
  __syncthreads();  // warps may be reused
  return total;
}

// Called by every thread of every block once the block's partial sums are written:
// true in the block that finishes last, which may then read every block's partial sums
// (load_from_peer). The barrier makes the block's writes thread 0's to publish: its
// fence (cumulative) orders them before its count, and the last block's fence after its
// count orders the reads after every other block's. The count of finished blocks
// (*ticket, 0 before the launch) is left at 0 again.
__device__ inline bool last_block_done(unsigned* ticket) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    if (last) {
      *ticket = 0;  // every other block has counted itself
      __threadfence();
    }
  }
  __syncthreads();
  return last;
}

}  // namespace mnist_mt::cuda
