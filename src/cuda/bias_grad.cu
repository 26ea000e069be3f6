// Bias gradients: a sum per channel over rows and positions, one block per channel.
#include "block_sum.cuh"
#include "element_ops.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void bias_grad_kernel(const float* __restrict__ dy, float* __restrict__ db, std::uint32_t rows,
                                        int channels, int spatial) {
  __shared__ float partial[kBlock];
  const int c = blockIdx.x;
  const std::size_t total = std::size_t(rows) * spatial;
  float sum = 0.0f;
  for (std::size_t k = threadIdx.x; k < total; k += kBlock) sum += bias_grad_term(dy, k, c, channels, spatial);
  sum = block_sum(sum, partial);
  if (threadIdx.x == 0) db[c] = sum;
}

void bias_grad(const float* dy, float* db, std::uint32_t rows, int channels, int spatial, StreamHandle stream) {
  if (channels == 0) return;
  bias_grad_kernel<<<channels, kBlock, 0, stream>>>(dy, db, rows, channels, spatial);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
