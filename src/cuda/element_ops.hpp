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

// Element i of rows normalised from a split held on the device: pixel i % kImageBytes of
// the split's image samples[i / kImageBytes] (gather_images). 32-bit index math: a call
// covers at most a replica's rows.
MNIST_MT_HD float gather_normalize_at(const std::uint8_t* split_images, const std::uint32_t* samples, std::uint32_t i,
                                      float mean, float std) {
  constexpr auto kPixels = static_cast<std::uint32_t>(kImageBytes);
  return normalize_at(split_images, std::size_t{samples[i / kPixels]} * kPixels + i % kPixels, mean, std);
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

// conv2's bias and ReLU on pooled element i's window of a2[rows][channels][2side][2side]
// (in place, as bias_relu_dropout_at computes them without dropout: the backward reads
// them), then max_pool_dropout_forward_at of that window.
MNIST_MT_HD float bias_relu_max_pool_dropout_at(float* a2, const float* bias, std::size_t i, int channels, int side,
                                                const DropoutArgs& d) {
  const int stride = 2 * side;
  float* window = a2 + window_offset(i, side);
  const float b = bias[(i / (std::size_t(side) * side)) % channels];
  const int offsets[4] = {0, 1, stride, stride + 1};
  for (const int at : offsets) {
    const float v = window[at] + b;
    window[at] = v < 0.0f ? 0.0f : v;  // NaN passes
  }
  return max_pool_dropout_forward_at(a2, i, channels * side * side, side, d);
}

// Writes the four elements of grad_in in pooled element i's window, and returns the one
// that is not 0 by position (the gradient its maximum gets): the window's share of conv2's
// bias gradient.
MNIST_MT_HD float max_pool_dropout_backward_at(const float* in, const float* out, const float* grad_out,
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
  return g;
}

// ---- conv1 (1 -> kConv1Channels, 3x3, valid), own kernels instead of cuDNN ----
inline constexpr int kConv1Planes = static_cast<int>(kConv1Channels);
inline constexpr int kConv1Positions = static_cast<int>(kConv1Side * kConv1Side);
inline constexpr int kConv1Block = 256;  // conv1_backward's threads per plane
inline constexpr int kWarp = 32;

// Element i of conv1's output after its bias and ReLU, out[rows][32][26][26], from
// x[rows][28][28] (normalised), weights [32][9] and bias: the bias, then the nine taps in
// row-major order, each a fused multiply-add, as the CPU backend's kernel adds them.
// NaN passes the ReLU.
MNIST_MT_HD float conv1_forward_at(const float* x, const float* w, const float* b, std::size_t i) {
  constexpr int side = static_cast<int>(kConv1Side), in = static_cast<int>(kImageSide);
  const std::size_t plane = i / kConv1Positions;
  const int at = static_cast<int>(i % kConv1Positions), c = static_cast<int>(plane % kConv1Planes);
  const float* window = x + (plane / kConv1Planes) * (std::size_t(in) * in) + (at / side) * in + at % side;
  const float* taps = w + c * kConv1Taps;
  float acc = b[c];
  for (int k = 0; k < kConv1Taps; ++k) acc = fmaf(window[(k / 3) * in + k % 3], taps[k], acc);
  return acc < 0.0f ? 0.0f : acc;
}

// Thread t's share of plane p's (row p / 32, channel p % 32) gradient sums: positions t,
// t + threads, ... in order, each term the output gradient where the forward output is
// positive (ReLU's backward), times the tap's input (fused) for the nine weights, alone
// for the bias. `out`, `d_out`: [rows][32][26][26].
MNIST_MT_HD void conv1_grad_share(const float* x, const float* out, const float* d_out, std::size_t p, int t,
                                  int threads, float sums[kConv1Sums]) {
  constexpr int side = static_cast<int>(kConv1Side), in = static_cast<int>(kImageSide);
  for (int k = 0; k < kConv1Sums; ++k) sums[k] = 0.0f;
  const float* image = x + (p / kConv1Planes) * (std::size_t(in) * in);
  for (int at = t; at < kConv1Positions; at += threads) {
    const std::size_t i = p * kConv1Positions + at;
    const float d = out[i] > 0.0f ? d_out[i] : 0.0f;
    const float* window = image + (at / side) * in + at % side;
    for (int k = 0; k < kConv1Taps; ++k) sums[k] = fmaf(window[(k / 3) * in + k % 3], d, sums[k]);
    sums[kConv1Taps] += d;
  }
}

// Host only, the reference of block_sum.cuh's order: `threads` (a multiple of 32)
// values, one a thread, added within each warp by halving (lane l += lane l + h for h =
// 16, 8, 4, 2, 1), then the warps' totals in warp order.
inline float block_tree_sum(const float* shares, int threads) {
  float total = 0.0f;
  for (int w = 0; w < threads / kWarp; ++w) {
    float lane[kWarp];
    for (int l = 0; l < kWarp; ++l) lane[l] = shares[w * kWarp + l];
    for (int h = kWarp / 2; h > 0; h /= 2)
      for (int l = 0; l < h; ++l) lane[l] += lane[l + h];
    total = w == 0 ? lane[0] : total + lane[0];
  }
  return total;
}

// A value another block of the same launch wrote: past the L1 cache on the device.
MNIST_MT_HD float load_from_peer(const float* p) {
#ifdef __CUDA_ARCH__
  return __ldcg(p);
#else
  return *p;
#endif
}

// Sum k of channel c over the rows: partial[rows][channels][sums] added over the rows in
// order in double, rounded once, as the CPU backend adds its images' sums.
MNIST_MT_HD float rows_total_at(const float* partial, std::uint32_t rows, int channels, int sums, int c, int k) {
  double total = 0;
  for (std::uint32_t n = 0; n < rows; ++n)
    total += load_from_peer(partial + (std::size_t(n) * channels + c) * sums + k);
  return static_cast<float>(total);
}

// Gradient j of conv1 (j = channel * kConv1Sums + k: weight tap k < 9, or the bias at k =
// 9) from every plane's sums (partial[rows][32][kConv1Sums]).
MNIST_MT_HD void conv1_grad_total_at(const float* partial, std::uint32_t rows, int j, float* dw, float* db) {
  const int c = j / kConv1Sums, k = j % kConv1Sums;
  const float total = rows_total_at(partial, rows, kConv1Planes, kConv1Sums, c, k);
  if (k < kConv1Taps) {
    dw[c * kConv1Taps + k] = total;
  } else {
    db[c] = total;
  }
}

// Host only, the kernel's reference: plane p's sums as conv1_backward's block of
// kConv1Block threads adds them: each thread's share (conv1_grad_share), then
// block_tree_sum's order.
inline void conv1_plane_sums(const float* x, const float* out, const float* d_out, std::size_t p,
                             float sums[kConv1Sums]) {
  static_assert(kConv1Block % kWarp == 0);
  float share[kConv1Block][kConv1Sums];
  for (int t = 0; t < kConv1Block; ++t) conv1_grad_share(x, out, d_out, p, t, kConv1Block, share[t]);
  for (int k = 0; k < kConv1Sums; ++k) {
    float column[kConv1Block];
    for (int t = 0; t < kConv1Block; ++t) column[t] = share[t][k];
    sums[k] = block_tree_sum(column, kConv1Block);
  }
}

// ---- conv2's bias gradient inside max-pool's backward (max_pool_dropout_backward) ----
inline constexpr int kPoolBlock = 128;  // threads per plane (row, channel) of 12x12 windows

// Thread t's share of plane p's bias-gradient sum: the gradients its windows t, t +
// threads, ... give their maxima (max_pool_dropout_backward_at, which writes them), in order.
MNIST_MT_HD float pool_backward_share(const float* in, const float* out, const float* grad_out, float* grad_in,
                                      std::size_t p, int side, float scale, int t, int threads) {
  const int windows = side * side;
  float share = 0.0f;
  for (int w = t; w < windows; w += threads)
    share += max_pool_dropout_backward_at(in, out, grad_out, grad_in, p * windows + w, side, scale);
  return share;
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

// ---- fc2 (128 -> 10) with the loss and its gradients in one kernel (fc2_loss) ----
inline constexpr int kFc2In = static_cast<int>(kHidden);

// fc2's product without its bias, z[r][k] = sum over i of h[r][i] w[k][i] (w: [10][128]),
// the 128 terms fused in order.
MNIST_MT_HD float fc2_product_at(const float* h, const float* w, std::uint32_t r, int k) {
  const float* row = h + std::size_t(r) * kFc2In;
  const float* weights = w + std::size_t(k) * kFc2In;
  float acc = 0.0f;
  for (int i = 0; i < kFc2In; ++i) acc = fmaf(row[i], weights[i], acc);
  return acc;
}

// fc2's weight gradient j = k * 128 + i: dlogits[r][k] h[r][i] over the rows in order, fused.
MNIST_MT_HD float fc2_weight_grad_at(const float* dlogits, const float* h, std::uint32_t rows, int j) {
  const int k = j / kFc2In, i = j % kFc2In;
  float acc = 0.0f;
  for (std::uint32_t r = 0; r < rows; ++r)
    acc = fmaf(dlogits[std::size_t(r) * kLogits + k], h[std::size_t(r) * kFc2In + i], acc);
  return acc;
}

// Column k of m[rows][width] added over the rows in order: fc2's bias gradient from the
// logits' gradients (width 10), fc1's from the gradient at its output (width 128).
MNIST_MT_HD float column_sum_at(const float* m, std::uint32_t rows, int width, int k) {
  float acc = 0.0f;
  for (std::uint32_t r = 0; r < rows; ++r) acc += m[std::size_t(r) * width + k];
  return acc;
}

// Element i = r * 128 + c of the gradient at fc1's output before its ReLU and dropout:
// dlogits[r][k] w[k][c] over the ten classes, fused in order, then relu_dropout_backward's
// rule: it passes, times `scale`, where the forward output h is positive.
MNIST_MT_HD float fc2_input_grad_at(const float* dlogits, const float* w, const float* h, std::size_t i,
                                    float scale) {
  const std::size_t r = i / kFc2In;
  const int c = static_cast<int>(i % kFc2In);
  float acc = 0.0f;
  for (int k = 0; k < kLogits; ++k) acc = fmaf(dlogits[r * kLogits + k], w[k * kFc2In + c], acc);
  return h[i] > 0.0f ? acc * scale : 0.0f;
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
