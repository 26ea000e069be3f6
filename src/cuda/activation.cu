// Bias + ReLU (+ dropout) after a convolution or fc1, and its backward.
#include "dropout.cuh"
#include "kernels.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void bias_relu_dropout_kernel(float* __restrict__ y, const float* __restrict__ bias,
                                                std::size_t count, int channels, int spatial, DropoutArgs dropout) {
  const std::size_t per_row = std::size_t(channels) * spatial;
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) {
    const float v = y[i] + bias[(i / spatial) % channels];
    y[i] = apply_dropout(v > 0.0f ? v : 0.0f, dropout, i / per_row, static_cast<std::uint32_t>(i % per_row));
  }
}

static __global__ void relu_dropout_backward_kernel(const float* __restrict__ out, float* __restrict__ grad,
                                                    std::size_t count, float scale) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    grad[i] = out[i] > 0.0f ? grad[i] * scale : 0.0f;
}

void bias_relu_dropout(float* y, const float* bias, std::uint32_t rows, int channels, int spatial,
                       const DropoutArgs& dropout, StreamHandle stream) {
  const std::size_t count = std::size_t(rows) * channels * spatial;
  if (count == 0) return;
  bias_relu_dropout_kernel<<<grid_for(count), kBlock, 0, stream>>>(y, bias, count, channels, spatial, dropout);
  CHECK_LAUNCH();
}

void relu_dropout_backward(const float* out, float* grad, std::size_t count, float scale, StreamHandle stream) {
  if (count == 0) return;
  relu_dropout_backward_kernel<<<grid_for(count), kBlock, 0, stream>>>(out, grad, count, scale);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
