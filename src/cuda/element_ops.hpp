#pragma once
// The per-element math of the own CUDA kernels, as functions both nvcc and the host
// compiler build (MNIST_MT_HD): each kernel is a grid-stride loop over one of them, and
// the tests use them as the kernels' CPU reference. `_at(..., i)` computes what the
// kernel writes for index i of its loop. No CUDA runtime needed on the host.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/philox.hpp"

namespace mnist_mt::cuda {

// model.hpp's kClasses, as the int the kernels index with.
inline constexpr int kLogits = static_cast<int>(kClasses);

using mnist_mt::add_rn;  // host_device.hpp: rounded apart, never fused
using mnist_mt::mul_rn;

MNIST_MT_HD float normalize_at(const std::uint8_t* images, std::size_t i, float mean, float std) {
  return (static_cast<float>(images[i]) / 255.0f - mean) / std;
}

// Dropout of element `element` of row `row`; samples are read only when p > 0. A product
// with 0 rather than a 0, so a dropped NaN stays NaN, as in PyTorch and the CPU backend.
MNIST_MT_HD float apply_dropout(float v, const DropoutArgs& d, std::size_t row, std::uint32_t element) {
  if (d.p <= 0.0f) return v;
  const std::uint32_t epoch = d.epoch_at != nullptr ? *d.epoch_at : d.epoch;
  return v * (dropout_keep(d.seed, epoch, d.samples[row], d.stream, element, d.p) ? d.scale : 0.0f);
}

// y[rows][channels][spatial] after bias, ReLU and dropout.
MNIST_MT_HD float bias_relu_dropout_at(const float* y, const float* bias, std::size_t i, int channels, int spatial,
                                       const DropoutArgs& d) {
  const std::size_t per_row = std::size_t(channels) * spatial;
  const float v = y[i] + bias[(i / spatial) % channels];
  return apply_dropout(v < 0.0f ? 0.0f : v, d, i / per_row, static_cast<std::uint32_t>(i % per_row));  // NaN passes
}

MNIST_MT_HD float relu_dropout_backward_at(const float* out, const float* grad, std::size_t i, float scale) {
  return out[i] > 0.0f ? grad[i] * scale : 0.0f;
}

// Index (0..3, row-major) of the window's first maximum, or its last NaN: PyTorch's pick.
MNIST_MT_HD int window_argmax(const float* window, int stride) {
  const float v[4] = {window[0], window[1], window[stride], window[stride + 1]};
  int best = 0;
  for (int k = 1; k < 4; ++k)
    if (v[k] > v[best] || v[k] != v[k]) best = k;
  return best;
}

// Offset of pooled element i's window in the input, which has twice the side.
MNIST_MT_HD std::size_t window_offset(std::size_t i, int side) {
  const std::size_t plane = i / (std::size_t(side) * side);  // row * channels + channel
  const int r = static_cast<int>(i % (std::size_t(side) * side));
  const int in_side = 2 * side;
  return (plane * in_side + 2 * (r / side)) * in_side + 2 * (r % side);
}

// Pooled element i of in[rows][channels][2side][2side], per_row = channels*side*side.
MNIST_MT_HD float max_pool_dropout_forward_at(const float* in, std::size_t i, int per_row, int side,
                                              const DropoutArgs& d) {
  const float* window = in + window_offset(i, side);
  const int best = window_argmax(window, 2 * side);
  const float v = window[(best >> 1) * 2 * side + (best & 1)];
  return apply_dropout(v, d, i / per_row, static_cast<std::uint32_t>(i % per_row));
}

// Writes the four elements of grad_in in pooled element i's window.
MNIST_MT_HD void max_pool_dropout_backward_at(const float* in, const float* out, const float* grad_out,
                                              float* grad_in, std::size_t i, int side, float scale) {
  const int stride = 2 * side;
  const std::size_t at = window_offset(i, side);
  const int best = window_argmax(in + at, stride);
  const float g = out[i] > 0.0f ? grad_out[i] * scale : 0.0f;
  float* window = grad_in + at;
  window[0] = best == 0 ? g : 0.0f;
  window[1] = best == 1 ? g : 0.0f;
  window[stride] = best == 2 ? g : 0.0f;
  window[stride + 1] = best == 3 ? g : 0.0f;
}

// Term k (0 <= k < rows*spatial) of channel c's bias gradient; the kernel sums the terms
// in a fixed order of its own (block_sum.cuh).
MNIST_MT_HD float bias_grad_term(const float* dy, std::size_t k, int c, int channels, int spatial) {
  const std::size_t row = k / spatial;
  return dy[(row * channels + c) * spatial + k % spatial];
}

struct RowLoss {
  float nll;     // -logprob of the label
  bool correct;  // the first maximal logit is the label's
};

// Row r of log_softmax_nll: logprobs and dlogits of its kLogits logits z + bias.
MNIST_MT_HD RowLoss log_softmax_nll_at(const float* z, const float* bias, const std::uint8_t* labels,
                                       std::uint32_t r, float denominator, float* logprobs, float* dlogits) {
  float logit[kLogits];
  int best = 0;
  for (int k = 0; k < kLogits; ++k) {
    logit[k] = z[r * kLogits + k] + bias[k];
    if (logit[k] > logit[best]) best = k;
  }
  const float max = logit[best];
  float sum = 0.0f;
  for (int k = 0; k < kLogits; ++k) sum += expf(logit[k] - max);
  const float log_sum = logf(sum);
  const int label = labels[r];
  RowLoss row{0.0f, best == label};
  for (int k = 0; k < kLogits; ++k) {
    const float lp = (logit[k] - max) - log_sum;
    logprobs[r * kLogits + k] = lp;
    dlogits[r * kLogits + k] = (expf(lp) - (k == label ? 1.0f : 0.0f)) / denominator;
    if (k == label) row.nll = -lp;
  }
  return row;
}

// The optimizer's update of element i (optimizer.hpp), by the optimizer of `s`.
MNIST_MT_HD void update_at(float* params, const float* grads, float* first, float* second, std::size_t i,
                           const UpdateScalars& s) {
  switch (s.kind) {
    case OptimizerKind::kSgd: sgd_at(params, grads, first, i, s); return;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: adam_at(params, grads, first, second, i, s); return;
    case OptimizerKind::kAdadelta: adadelta_at(params, grads, first, second, i, s); return;
  }
}

}  // namespace mnist_mt::cuda
