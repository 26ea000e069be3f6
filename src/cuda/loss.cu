// log_softmax + NLL over the 10 classes, its gradient, and the running stats. One block:
// a batch is at most a few thousand rows, and one block sums them in a fixed order.
#include "block_sum.cuh"
#include "element_ops.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

// Every thread: the block's loss and correct sums (block_sum's order) added to
// stats[0..2] with the rows, by thread 0.
static __device__ void add_stats(double loss, double correct, std::uint32_t rows, double* stats, double* partial) {
  loss = block_sum(loss, partial);
  __syncthreads();  // partial is reused
  correct = block_sum(correct, partial);
  if (threadIdx.x == 0) {
    stats[0] += loss;
    stats[1] += correct;
    stats[2] += rows;
  }
}

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
  add_stats(loss, correct, rows, stats, partial);
}

// Rows a thread: fc2's ten products, then the loss as log_softmax_nll_kernel adds it;
// once every row's dlogits are written, the gradients, each a thread's sum in order.
// The arguments are plain pointers: dlogits is written and then read by other threads.
static __global__ void fc2_loss_kernel(Fc2LossArgs a) {
  __shared__ double partial[kBlock];
  double loss = 0.0, correct = 0.0;
  for (std::uint32_t r = threadIdx.x; r < a.rows; r += kBlock) {
    for (int k = 0; k < kLogits; ++k) a.z[std::size_t(r) * kLogits + k] = fc2_product_at(a.h, a.w, r, k);
    const RowLoss row = log_softmax_nll_at(a.z, a.bias, a.labels, r, a.denominator, a.logprobs, a.dlogits);
    loss += row.nll;
    correct += row.correct ? 1.0 : 0.0;
  }
  add_stats(loss, correct, a.rows, a.stats, partial);
  if (a.dw == nullptr) return;
  __syncthreads();  // every row's dlogits are written and visible to the block
  for (int j = threadIdx.x; j < kLogits * kFc2In; j += kBlock)
    a.dw[j] = fc2_weight_grad_at(a.dlogits, a.h, a.rows, j);
  for (int k = threadIdx.x; k < kLogits; k += kBlock) a.db[k] = column_sum_at(a.dlogits, a.rows, kLogits, k);
  const std::size_t count = std::size_t(a.rows) * kFc2In;
  for (std::size_t i = threadIdx.x; i < count; i += kBlock) a.dh[i] = fc2_input_grad_at(a.dlogits, a.w, a.h, i, a.scale);
  __syncthreads();  // every element of dh is written and visible to the block
  for (int c = threadIdx.x; c < kFc2In; c += kBlock) a.dh_bias[c] = column_sum_at(a.dh, a.rows, kFc2In, c);
}

void fc2_loss(const Fc2LossArgs& args, StreamHandle stream) {
  if (args.rows == 0) return;
  fc2_loss_kernel<<<1, kBlock, 0, stream>>>(args);
  CHECK_LAUNCH();
}

void log_softmax_nll(const float* z, const float* bias, const std::uint8_t* labels, std::uint32_t rows,
                     float denominator, float* logprobs, float* dlogits, double* stats, StreamHandle stream) {
  if (rows == 0) return;
  log_softmax_nll_kernel<<<1, kBlock, 0, stream>>>(z, bias, labels, rows, denominator, logprobs, dlogits, stats);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
