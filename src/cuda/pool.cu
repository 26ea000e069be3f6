// 2x2 max-pool with the dropout after it, forward and backward in one pass each.
#include "dropout.cuh"
#include "kernels.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

// Index (0..3, row-major) of the window's first maximum, as PyTorch picks it.
__device__ __forceinline__ int window_argmax(const float* window, int stride) {
  const float v[4] = {window[0], window[1], window[stride], window[stride + 1]};
  int best = 0;
  for (int k = 1; k < 4; ++k)
    if (v[k] > v[best]) best = k;
  return best;
}

// Offset of pooled element i's window in the input, which has twice the side.
__device__ __forceinline__ std::size_t window_offset(std::size_t i, int side) {
  const std::size_t plane = i / (std::size_t(side) * side);  // row * channels + channel
  const int r = static_cast<int>(i % (std::size_t(side) * side));
  const int in_side = 2 * side;
  return (plane * in_side + 2 * (r / side)) * in_side + 2 * (r % side);
}

static __global__ void max_pool_dropout_forward_kernel(const float* __restrict__ in, float* __restrict__ out,
                                                       std::size_t count, int per_row, int side,
                                                       DropoutArgs dropout) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) {
    const float* window = in + window_offset(i, side);
    const int best = window_argmax(window, 2 * side);
    const float v = window[(best >> 1) * 2 * side + (best & 1)];
    out[i] = apply_dropout(v, dropout, i / per_row, static_cast<std::uint32_t>(i % per_row));
  }
}

static __global__ void max_pool_dropout_backward_kernel(const float* __restrict__ in, const float* __restrict__ out,
                                                        const float* __restrict__ grad_out,
                                                        float* __restrict__ grad_in, std::size_t count, int side,
                                                        float scale) {
  const int stride = 2 * side;
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) {
    const std::size_t at = window_offset(i, side);
    const int best = window_argmax(in + at, stride);
    const float g = out[i] > 0.0f ? grad_out[i] * scale : 0.0f;
    float* window = grad_in + at;
    window[0] = best == 0 ? g : 0.0f;
    window[1] = best == 1 ? g : 0.0f;
    window[stride] = best == 2 ? g : 0.0f;
    window[stride + 1] = best == 3 ? g : 0.0f;
  }
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
