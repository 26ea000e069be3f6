// log_softmax + NLL over the 10 classes, its gradient, and the running stats. One block:
// a batch is at most a few thousand rows, and one block sums them in a fixed order.
#include "block_sum.cuh"
#include "kernels.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

constexpr int kClasses = 10;

static __global__ void log_softmax_nll_kernel(const float* __restrict__ z, const float* __restrict__ bias,
                                              const std::uint8_t* __restrict__ labels, std::uint32_t rows,
                                              float denominator, float* __restrict__ logprobs,
                                              float* __restrict__ dlogits, double* __restrict__ stats) {
  __shared__ double partial[kBlock];
  double loss = 0.0, correct = 0.0;
  for (std::uint32_t r = threadIdx.x; r < rows; r += kBlock) {
    float logit[kClasses];
    int best = 0;
    for (int k = 0; k < kClasses; ++k) {
      logit[k] = z[r * kClasses + k] + bias[k];
      if (logit[k] > logit[best]) best = k;
    }
    const float max = logit[best];
    float sum = 0.0f;
    for (int k = 0; k < kClasses; ++k) sum += expf(logit[k] - max);
    const float log_sum = logf(sum);
    const int label = labels[r];
    for (int k = 0; k < kClasses; ++k) {
      const float lp = (logit[k] - max) - log_sum;
      logprobs[r * kClasses + k] = lp;
      dlogits[r * kClasses + k] = (expf(lp) - (k == label ? 1.0f : 0.0f)) / denominator;
      if (k == label) loss -= lp;
    }
    correct += best == label ? 1.0 : 0.0;
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
