// 2x2 max-pool with the dropout after it, forward and backward in one pass each.
#include "element_ops.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void max_pool_dropout_forward_kernel(const float* __restrict__ in, float* __restrict__ out,
                                                       std::size_t count, int per_row, int side,
                                                       DropoutArgs dropout) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    out[i] = max_pool_dropout_forward_at(in, i, per_row, side, dropout);
}

static __global__ void max_pool_dropout_backward_kernel(const float* __restrict__ in, const float* __restrict__ out,
                                                        const float* __restrict__ grad_out,
                                                        float* __restrict__ grad_in, std::size_t count, int side,
                                                        float scale) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    max_pool_dropout_backward_at(in, out, grad_out, grad_in, i, side, scale);
}

void max_pool_dropout_forward(const float* in, float* out, std::uint32_t rows, int channels, int side,
                              const DropoutArgs& dropout, StreamHandle stream) {
  const int per_row = channels * side * side;
  const std::size_t count = std::size_t(rows) * per_row;
  if (count == 0) return;
  max_pool_dropout_forward_kernel<<<grid_for(count), kBlock, 0, stream>>>(in, out, count, per_row, side, dropout);
  CHECK_LAUNCH();
}

void max_pool_dropout_backward(const float* in, const float* out, const float* grad_out, float* grad_in,
                               std::uint32_t rows, int channels, int side, float scale, StreamHandle stream) {
  const std::size_t count = std::size_t(rows) * channels * side * side;
  if (count == 0) return;
  max_pool_dropout_backward_kernel<<<grid_for(count), kBlock, 0, stream>>>(in, out, grad_out, grad_in, count, side,
                                                                           scale);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
