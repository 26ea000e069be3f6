// The sum of squares of a flat buffer in double (the gradients' norm), in squares.cuh's
// order: the same bits on every run and every rank.
#include "kernels.hpp"
#include "launch.cuh"
#include "squares.cuh"

namespace mnist_mt::cuda {

static __global__ void partial_squares_kernel(const float* __restrict__ x, std::size_t count,
                                              double* __restrict__ partial) {
  __shared__ double shared[kBlock];
  const double sum = block_partial_squares(x, count, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

static __global__ void total_kernel(const double* __restrict__ partial, unsigned blocks, double* __restrict__ out) {
  __shared__ double shared[kBlock];
  const double sum = total_of_partials(partial, blocks, shared);
  if (threadIdx.x == 0) *out = sum;
}

void sum_of_squares(const float* x, std::size_t count, double* scratch, StreamHandle stream) {
  partial_squares_kernel<<<kSquareBlocks, kBlock, 0, stream>>>(x, count, scratch);
  CHECK_LAUNCH();
  total_kernel<<<1, kBlock, 0, stream>>>(scratch, kSquareBlocks, scratch + kSquareBlocks);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
