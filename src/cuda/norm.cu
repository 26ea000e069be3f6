// The sum of squares of a flat buffer in double (the gradients' norm). A fixed grid of
// blocks each sums a fixed strided share in block_sum's tree order and one block adds
// their partial sums in block order: the same bits on every run and every rank.
#include "block_sum.cuh"
#include "kernels.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void partial_squares_kernel(const float* __restrict__ x, std::size_t count,
                                              double* __restrict__ partial) {
  __shared__ double shared[kBlock];
  double sum = 0;
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) {
    const double v = x[i];
    sum += v * v;  // exact: a float's square fits a double, so contraction changes nothing
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

static __global__ void total_kernel(const double* __restrict__ partial, unsigned blocks, double* __restrict__ out) {
  __shared__ double shared[kBlock];
  double sum = 0;
  for (unsigned i = threadIdx.x; i < blocks; i += blockDim.x) sum += partial[i];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) *out = sum;
}

void sum_of_squares(const float* x, std::size_t count, double* scratch, StreamHandle stream) {
  partial_squares_kernel<<<kSquareBlocks, kBlock, 0, stream>>>(x, count, scratch);
  CHECK_LAUNCH();
  total_kernel<<<1, kBlock, 0, stream>>>(scratch, kSquareBlocks, scratch + kSquareBlocks);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
