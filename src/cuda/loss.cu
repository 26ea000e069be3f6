// log_softmax + NLL over the 10 classes, its gradient, and the running stats. One block:
// a batch is at most a few thousand rows, and one block sums them in a fixed order.
#include "block_sum.cuh"
#include "element_ops.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void log_softmax_nll_kernel(const float* __restrict__ z, const float* __restrict__ bias,
                                              const std::uint8_t* __restrict__ labels, std::uint32_t rows,
                                              float denominator, float* __restrict__ logprobs,
                                              float* __restrict__ dlogits, double* __restrict__ stats) {
  __shared__ double partial[kBlock];
  double loss = 0.0, correct = 0.0;
  for (std::uint32_t r = threadIdx.x; r < rows; r += kBlock) {
    const RowLoss row = log_softmax_nll_at(z, bias, labels, r, denominator, logprobs, dlogits);
    loss += row.nll;
    correct += row.correct ? 1.0 : 0.0;
  }
  loss = block_sum(loss, partial);
  __syncthreads();  // partial is reused
  correct = block_sum(correct, partial);
  if (threadIdx.x == 0) {
    stats[0] += loss;
    stats[1] += correct;
    stats[2] += rows;
  }
}

void log_softmax_nll(const float* z, const float* bias, const std::uint8_t* labels, std::uint32_t rows,
                     float denominator, float* logprobs, float* dlogits, double* stats, StreamHandle stream) {
  if (rows == 0) return;
  log_softmax_nll_kernel<<<1, kBlock, 0, stream>>>(z, bias, labels, rows, denominator, logprobs, dlogits, stats);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
