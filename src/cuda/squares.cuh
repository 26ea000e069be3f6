#pragma once
// The gradients' sum of squares in double, in two fixed orders: a block's strided share
// in block_sum's tree order, then the blocks' partial sums in block order (norm.cu's
// sum_of_squares and update.cu's guard both add this way, so their totals are the same
// bits on every run and every rank).
#include "block_sum.cuh"

namespace mnist_mt::cuda {

// This block's partial sum of x[i]^2 over its grid-stride share; returned to thread 0.
__device__ inline double block_partial_squares(const float* __restrict__ x, std::size_t count, double* shared) {
  double sum = 0;
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) {
    const double v = x[i];
    sum += v * v;  // exact: a float's square fits a double, so contraction changes nothing
  }
  return block_sum(sum, shared);
}

// The sum of `blocks` partial sums, by one block; returned to thread 0. The partials are
// read past the L1 cache: other blocks of the same launch may have written them.
__device__ inline double total_of_partials(const double* partial, unsigned blocks, double* shared) {
  double sum = 0;
  for (unsigned i = threadIdx.x; i < blocks; i += blockDim.x) sum += __ldcg(partial + i);
  return block_sum(sum, shared);
}

}  // namespace mnist_mt::cuda
