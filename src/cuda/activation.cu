// Bias + ReLU (+ dropout) after a convolution or fc1, and its backward.
#include "element_ops.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void bias_relu_dropout_kernel(float* __restrict__ y, const float* __restrict__ bias,
                                                std::size_t count, int channels, int spatial, DropoutArgs dropout) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    y[i] = bias_relu_dropout_at(y, bias, i, channels, spatial, dropout);
}

static __global__ void relu_dropout_backward_kernel(const float* __restrict__ out, float* __restrict__ grad,
                                                    std::size_t count, float scale) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    grad[i] = relu_dropout_backward_at(out, grad, i, scale);
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
