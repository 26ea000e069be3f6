// The CUDA kernels' per-element math (src/cuda/element_ops.hpp, compiled here by the host
// compiler) against the CPU backend's own kernels, through what both promise: PyTorch's
// NCHW and flatten orders (the CPU's nChw{B}c maps are converted), the same Philox keys.
// Where the two round alike the results are compared bit for bit; sums whose order
// differs, and the loss (fp32 on the GPU, fp64 on the CPU), within a stated tolerance.
// No CUDA runtime: this runs in every build, sanitizers included. The GPU test
// (test_cuda_kernels.cpp) checks each kernel against these same functions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "cpu/conv1.hpp"
#include "cpu/isa.hpp"
#include "cpu/kernels.hpp"
#include "cpu/pool.hpp"
#include "cuda/element_ops.hpp"
#include "kernel_inputs.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt {
namespace {

using testing_inputs::blocked;
using testing_inputs::grid_values;
using testing_inputs::same;
using testing_inputs::sprinkle_nan;
using testing_inputs::uniform;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr DropoutKey kKey{0x1234'5678'9abcULL, 3};
const std::uint32_t kSamples[] = {17, 59'999, 4};  // global indices of the rows
constexpr std::uint32_t kRows = 3;

cuda::DropoutArgs dropout_args(RandomStream stream, float p) {
  return {kSamples, kKey.seed, kKey.epoch, stream, p, 1.0f / (1.0f - p)};  // as cuda/replica.cpp
}

class CudaReference : public ::testing::Test {
 protected:
  cpu::Isa isa_ = cpu::kernel_isa();
  std::size_t block_ = cpu::channel_block(isa_);
};

TEST_F(CudaReference, NormalizeMatchesTheCpuBitwise) {
  std::vector<std::uint8_t> pixels(256);
  for (int v = 0; v < 256; ++v) pixels[v] = static_cast<std::uint8_t>(v);
  std::vector<float> cpu_out(256);
  cpu::normalise_images(pixels.data(), pixels.size(), cpu_out.data());
  for (std::size_t i = 0; i < 256; ++i)
    ASSERT_EQ(cuda::normalize_at(pixels.data(), i, kInputMean, kInputStd), cpu_out[i]) << "pixel " << i;
  EXPECT_NE(cpu_out[0], cpu_out[255]);
}

// A batch gathered from a split held on the device: each row is its sample's image,
// normalised bit for bit as the CPU backend normalises the batch the loader copies.
TEST_F(CudaReference, GatheredRowsAreTheirSamplesNormalisedAsOnTheCpu) {
  constexpr std::uint32_t kSplit = 300;
  std::vector<std::uint8_t> split(std::size_t{kSplit} * kImageBytes);
  for (std::size_t i = 0; i < split.size(); ++i) split[i] = static_cast<std::uint8_t>((i * 131 + i / 97) % 256);
  const std::vector<std::uint32_t> samples{299, 0, 7, 7, 150, 1};
  std::vector<std::uint8_t> copied(samples.size() * kImageBytes);  // what the loader hands over
  for (std::size_t r = 0; r < samples.size(); ++r)
    std::memcpy(copied.data() + r * kImageBytes, split.data() + samples[r] * kImageBytes, kImageBytes);
  std::vector<float> cpu_out(copied.size());
  cpu::normalise_images(copied.data(), copied.size(), cpu_out.data());
  for (std::uint32_t i = 0; i < cpu_out.size(); ++i)
    ASSERT_EQ(cuda::gather_normalize_at(split.data(), samples.data(), i, kInputMean, kInputStd), cpu_out[i])
        << "element " << i << " (row " << i / kImageBytes << ")";
}

// fc1's bias + ReLU + dropout (spatial 1). On the CPU oneDNN adds fc1's bias and applies
// the ReLU, so those are written out here (NaN passing, as std::max does), then its dropout.
TEST_F(CudaReference, BiasReluDropoutMatchesTheCpuDropout) {
  const int channels = static_cast<int>(kHidden);
  std::vector<float> y = grid_values(kRows * kHidden, 1);
  const std::vector<float> bias = grid_values(kHidden, 2);
  sprinkle_nan(y, 37, 5);  // NaN passes the ReLU and stays NaN when dropped
  std::vector<float> cpu_out(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) cpu_out[i] = std::max(y[i] + bias[i % kHidden], 0.0f);
  cpu::dropout_forward(kKey, kSamples, kRows, RandomStream::kDropout1, kHidden, kDropout2, cpu_out.data());
  const cuda::DropoutArgs args = dropout_args(RandomStream::kDropout1, kDropout2);
  std::size_t kept = 0, dropped = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const float ref = cuda::bias_relu_dropout_at(y.data(), bias.data(), i, channels, 1, args);
    ASSERT_TRUE(same(ref, cpu_out[i])) << "element " << i << ": " << ref << " vs " << cpu_out[i];
    const float relu = std::max(y[i] + bias[i % kHidden], 0.0f);
    kept += relu > 0 && ref > 0;
    dropped += relu > 0 && ref == 0;
  }
  EXPECT_GT(kept, 20u);  // both outcomes occur, so the masks were compared
  EXPECT_GT(dropped, 20u);
}

// conv1's bias + ReLU: with only the centre tap set to 1, conv1(x) is exact, x[y+1][x+1]
// (or NaN where its window has one), so conv1(x) + b rounds once, alike on both sides.
TEST_F(CudaReference, BiasReluMatchesCpuConv1) {
  constexpr int kC = kConv1Channels, kP = kConv1Side * kConv1Side;
  std::vector<float> x = uniform(kRows * kImageSide * kImageSide, -1, 1, 3);
  const std::vector<float> bias = uniform(kC, -1, 1, 4);
  sprinkle_nan(x, 211, 100);
  std::vector<float> w(kC * 9, 0.0f);
  for (int c = 0; c < kC; ++c) w[c * 9 + 4] = 1.0f;
  std::vector<float> cpu_out(std::size_t{kRows} * kC * kP);
  cpu::conv1_kernels(isa_).forward(x.data(), w.data(), bias.data(), kRows, cpu_out.data());
  std::vector<float> conv(cpu_out.size());  // conv1(x) without bias, NCHW
  for (std::size_t i = 0; i < conv.size(); ++i) {
    const std::size_t n = i / (kC * kP), at = i % kP;
    conv[i] = 0.0f;
    for (std::size_t t = 0; t < 9; ++t)
      conv[i] += w[t] * x[(n * kImageSide + at / kConv1Side + t / 3) * kImageSide + at % kConv1Side + t % 3];
  }
  std::size_t positive = 0, nan = 0;
  for (std::size_t i = 0; i < conv.size(); ++i) {
    const float ref = cuda::bias_relu_dropout_at(conv.data(), bias.data(), i, kC, kP, {});
    const float got = cpu_out[blocked(i, kC, kConv1Side, block_)];
    ASSERT_TRUE(same(ref, got)) << "element " << i << ": " << ref << " vs " << got;
    positive += ref > 0;
    nan += std::isnan(ref);
  }
  EXPECT_GT(nan, 0u);
  EXPECT_GT(positive, conv.size() / 4);
  EXPECT_LT(positive, conv.size() * 3 / 4);
}

// conv2's bias + ReLU, the 2x2 max-pool and dropout1, forward and backward, against the
// CPU's fused ReLU + pool (on conv2's output with oneDNN's bias added) and its dropout.
TEST_F(CudaReference, PoolDropoutMatchesCpuPool) {
  constexpr int kC = kConv2Channels, kP = kConv2Side * kConv2Side;
  std::vector<float> pre = grid_values(std::size_t{kRows} * kC * kP, 5);
  const std::vector<float> bias = grid_values(kC, 6);
  sprinkle_nan(pre, 1009, 3);  // a NaN is its window's maximum and gets no gradient
  const cuda::DropoutArgs drop = dropout_args(RandomStream::kDropout0, kDropout1);
  std::vector<float> a2(pre.size()), pooled(kRows * kFlat);
  for (std::size_t i = 0; i < a2.size(); ++i) a2[i] = cuda::bias_relu_dropout_at(pre.data(), bias.data(), i, kC, kP, {});
  for (std::size_t i = 0; i < pooled.size(); ++i)
    pooled[i] = cuda::max_pool_dropout_forward_at(a2.data(), i, kFlat, kPoolSide, drop);
  // The fused pass (bias and ReLU written back, then the pool) equals the two above.
  std::vector<float> fused = pre;
  for (std::size_t i = 0; i < pooled.size(); ++i)
    ASSERT_TRUE(same(cuda::bias_relu_max_pool_dropout_at(fused.data(), bias.data(), i, kC, kPoolSide, drop), pooled[i]))
        << "pooled " << i;
  for (std::size_t i = 0; i < a2.size(); ++i) ASSERT_TRUE(same(fused[i], a2[i])) << "a2 " << i;

  std::vector<float> in(pre.size()), flat(pooled.size());
  for (std::size_t i = 0; i < pre.size(); ++i) in[blocked(i, kC, kConv2Side, block_)] = pre[i] + bias[i / kP % kC];
  std::vector<std::uint8_t> argmax(pooled.size());
  const cpu::PoolKernels pool = cpu::pool_kernels(isa_);
  pool.forward(in.data(), kRows, flat.data(), argmax.data());
  cpu::dropout_forward(kKey, kSamples, kRows, RandomStream::kDropout0, kFlat, kDropout1, flat.data());
  for (std::size_t i = 0; i < pooled.size(); ++i)
    ASSERT_TRUE(same(pooled[i], flat[i])) << "pooled " << i << ": " << pooled[i] << " vs " << flat[i];
  EXPECT_GT(std::count_if(pooled.begin(), pooled.end(), [](float v) { return std::isnan(v); }), 0);

  const std::vector<float> d_out = uniform(pooled.size(), -1, 1, 7);
  std::vector<float> da2(pre.size(), kNaN), d_flat = d_out, d_in(pre.size(), kNaN);  // NaN: unwritten
  for (std::size_t i = 0; i < pooled.size(); ++i)
    cuda::max_pool_dropout_backward_at(a2.data(), pooled.data(), d_out.data(), da2.data(), i, kPoolSide, drop.scale);
  cpu::relu_dropout_backward(flat.data(), drop.scale, flat.size(), d_flat.data());
  pool.backward(d_flat.data(), argmax.data(), kRows, d_in.data());
  std::size_t passed = 0;
  for (std::size_t i = 0; i < da2.size(); ++i) {
    const float got = d_in[blocked(i, kC, kConv2Side, block_)];
    ASSERT_FALSE(std::isnan(da2[i])) << "gradient " << i << " unwritten";
    ASSERT_TRUE(same(da2[i], got)) << "gradient " << i << ": " << da2[i] << " vs " << got;
    passed += da2[i] != 0;
  }
  // Ties between positive maxima are common on this grid, so "first maximum" was decided.
  std::size_t ties = 0;
  for (std::size_t i = 0; i < pooled.size(); ++i) {
    const float* w = a2.data() + cuda::window_offset(i, kPoolSide);
    const float v[4] = {w[0], w[1], w[2 * kPoolSide], w[2 * kPoolSide + 1]};
    const float m = *std::max_element(v, v + 4);
    ties += m > 0 && std::count(v, v + 4, m) > 1;
  }
  EXPECT_GT(ties, pooled.size() / 20);
  EXPECT_GT(passed, pooled.size() / 4);

  // conv2's bias gradient as the backward kernel adds it (each thread's windows' shares,
  // block_tree_sum, then the rows in double) against the CPU's gradient map summed per
  // channel in float64: within terms * 2^-24 * sum|term|.
  std::vector<float> planes(std::size_t{kRows} * kC), scratch(pre.size());
  for (std::size_t plane = 0; plane < planes.size(); ++plane) {
    float shares[cuda::kPoolBlock];
    for (int t = 0; t < cuda::kPoolBlock; ++t)
      shares[t] = cuda::pool_backward_share(a2.data(), pooled.data(), d_out.data(), scratch.data(), plane, kPoolSide,
                                            drop.scale, t, cuda::kPoolBlock);
    planes[plane] = cuda::block_tree_sum(shares, cuda::kPoolBlock);
  }
  EXPECT_EQ(scratch, da2) << "the shares write the gradient map";
  int nonzero = 0;
  for (int c = 0; c < kC; ++c) {
    double value = 0, magnitude = 0;
    for (std::size_t n = 0; n < kRows; ++n)
      for (int at = 0; at < kP; ++at) {
        const float g = d_in[blocked((n * kC + c) * kP + at, kC, kConv2Side, block_)];
        value += g;
        magnitude += std::abs(g);
      }
    EXPECT_NEAR(cuda::rows_total_at(planes.data(), kRows, kC, 1, c, 0), value,
                static_cast<double>(kRows) * kP * 0x1p-24 * magnitude)
        << "channel " << c;
    nonzero += magnitude > 0;
  }
  EXPECT_GT(nonzero, kC * 3 / 4);  // this grid's bias leaves a few channels all below 0
}

// The bias gradient's terms, summed here in fp64, against conv1's bias gradient on the
// CPU (ReLU's backward applied there, relu_dropout_backward_at here). Tolerance: any fp32
// summation order of n terms is within n * 2^-24 * sum|term| of the exact sum.
TEST_F(CudaReference, BiasGradMatchesCpuConv1) {
  constexpr int kC = kConv1Channels, kP = kConv1Side * kConv1Side;
  const std::vector<float> x = uniform(kRows * kImageSide * kImageSide, -1, 1, 8);  // ReLU cuts about half
  const std::vector<float> w = uniform(kC * 9, -0.5, 0.5, 9), b = uniform(kC, -0.3f, 0.3f, 10);
  const std::vector<float> d_out = uniform(std::size_t{kRows} * kC * kP, -1, 1, 11);
  std::vector<float> out_b(d_out.size()), d_out_b(d_out.size()), a1(d_out.size()), da1(d_out.size());
  const cpu::Conv1Kernels conv1 = cpu::conv1_kernels(isa_);
  conv1.forward(x.data(), w.data(), b.data(), kRows, out_b.data());
  for (std::size_t i = 0; i < d_out.size(); ++i) {
    a1[i] = out_b[blocked(i, kC, kConv1Side, block_)];
    d_out_b[blocked(i, kC, kConv1Side, block_)] = d_out[i];
  }
  std::vector<float> dw(kC * 9), db(kC);
  conv1.backward_weights(x.data(), out_b.data(), d_out_b.data(), kRows, dw.data(), db.data());
  for (std::size_t i = 0; i < da1.size(); ++i) da1[i] = cuda::relu_dropout_backward_at(a1.data(), d_out.data(), i, 1.0f);
  const std::size_t terms = std::size_t{kRows} * kP;
  int masked = 0;  // channels whose sum the mask changes beyond the tolerance
  for (int c = 0; c < kC; ++c) {
    double sum = 0, magnitude = 0, unmasked = 0;
    for (std::size_t k = 0; k < terms; ++k) {
      const float t = cuda::bias_grad_term(da1.data(), k, c, kC, kP);
      sum += t;
      magnitude += std::abs(t);
      unmasked += cuda::bias_grad_term(d_out.data(), k, c, kC, kP);
    }
    const double tolerance = static_cast<double>(terms) * 0x1p-24 * magnitude;
    EXPECT_NEAR(db[c], sum, tolerance) << "channel " << c;
    masked += std::abs(unmasked - sum) > 4 * tolerance;
  }
  EXPECT_GE(masked, kC * 3 / 4);
}

// conv1's own CUDA kernels against the CPU backend's conv1, both from the same normalised
// images. Forward: the bias, then the nine taps fused in row-major order on both sides:
// bit for bit with the CPU's AVX2 and AVX-512 kernels, whose multiply-adds are fused too;
// the portable kernel rounds each product apart, within 20 roundings of the sum of |terms|
// (the count of bitwise equal outputs is printed). NaN inputs reach the same outputs. Backward: each image's plane sums in the GPU's tree
// order (fp32) against the CPU's sequential ones, then both add the images in double:
// within terms * 2^-24 * sum|term|.
TEST_F(CudaReference, Conv1MatchesTheCpuConv1) {
  constexpr int kC = kConv1Channels, kP = kConv1Side * kConv1Side;
  std::vector<float> x = uniform(kRows * kImageSide * kImageSide, -1, 1, 31);
  const std::vector<float> w = uniform(kC * 9, -0.5f, 0.5f, 32), b = uniform(kC, -0.3f, 0.3f, 33);
  std::vector<float> x_nan = x;
  sprinkle_nan(x_nan, 307, 50);
  const cpu::Conv1Kernels conv1 = cpu::conv1_kernels(isa_);
  std::vector<float> out_b(std::size_t{kRows} * kC * kP), a1(out_b.size());
  conv1.forward(x_nan.data(), w.data(), b.data(), kRows, out_b.data());
  std::size_t nan = 0;
  for (std::size_t i = 0; i < a1.size(); ++i) {
    const float got = cuda::conv1_forward_at(x_nan.data(), w.data(), b.data(), i);
    ASSERT_EQ(std::isnan(got), std::isnan(out_b[blocked(i, kC, kConv1Side, block_)])) << "output " << i;
    nan += std::isnan(got);
  }
  EXPECT_GT(nan, 0u);

  conv1.forward(x.data(), w.data(), b.data(), kRows, out_b.data());
  std::size_t equal = 0, positive = 0;
  for (std::size_t i = 0; i < a1.size(); ++i) {
    a1[i] = cuda::conv1_forward_at(x.data(), w.data(), b.data(), i);
    const float cpu = out_b[blocked(i, kC, kConv1Side, block_)];
    const std::size_t n = i / (kC * kP), c = i / kP % kC, at = i % kP;
    double magnitude = std::abs(b[c]);
    for (std::size_t t = 0; t < 9; ++t)
      magnitude += std::abs(double{w[c * 9 + t]} *
                            x[(n * kImageSide + at / kConv1Side + t / 3) * kImageSide + at % kConv1Side + t % 3]);
    if (isa_ == cpu::Isa::kPortable) {
      ASSERT_NEAR(a1[i], cpu, 20 * 0x1p-24 * magnitude) << "output " << i;
    } else {
      ASSERT_TRUE(same(a1[i], cpu)) << "output " << i << ": " << a1[i] << " vs " << cpu;
    }
    equal += same(a1[i], cpu);
    positive += a1[i] > 0;
  }
  std::cout << "conv1 forward: " << equal << " of " << a1.size() << " outputs bitwise equal to the CPU's ("
            << cpu::isa_name(isa_) << ")\n";
  EXPECT_GT(positive, a1.size() / 4);
  EXPECT_LT(positive, a1.size() * 3 / 4);

  const std::vector<float> d_out = uniform(a1.size(), -1, 1, 34);
  std::vector<float> d_out_b(d_out.size());
  for (std::size_t i = 0; i < d_out.size(); ++i) d_out_b[blocked(i, kC, kConv1Side, block_)] = d_out[i];
  std::vector<float> cpu_dw(w.size()), cpu_db(b.size());
  conv1.backward_weights(x.data(), out_b.data(), d_out_b.data(), kRows, cpu_dw.data(), cpu_db.data());
  std::vector<float> planes(std::size_t{kRows} * kC * cuda::kConv1Sums), dw(w.size()), db(b.size());
  for (std::size_t p = 0; p < std::size_t{kRows} * kC; ++p)
    cuda::conv1_plane_sums(x.data(), a1.data(), d_out.data(), p, planes.data() + p * cuda::kConv1Sums);
  for (int j = 0; j < kC * cuda::kConv1Sums; ++j) cuda::conv1_grad_total_at(planes.data(), kRows, j, dw.data(), db.data());
  const std::size_t terms = std::size_t{kRows} * kP;
  for (int c = 0; c < kC; ++c)
    for (int k = 0; k < cuda::kConv1Sums; ++k) {
      double magnitude = 0;
      for (std::size_t t = 0; t < terms; ++t) {
        const std::size_t i = (t / kP * kC + c) * kP + t % kP, at = t % kP, n = t / kP;
        const double d = a1[i] > 0 ? d_out[i] : 0.0;
        const double in = k == cuda::kConv1Taps ? 1.0
                                                : x[(n * kImageSide + at / kConv1Side + k / 3) * kImageSide +
                                                    at % kConv1Side + k % 3];
        magnitude += std::abs(d * in);
      }
      const float got = k == cuda::kConv1Taps ? db[c] : dw[c * 9 + k];
      const float cpu = k == cuda::kConv1Taps ? cpu_db[c] : cpu_dw[c * 9 + k];
      EXPECT_NEAR(got, cpu, static_cast<double>(terms) * 0x1p-24 * magnitude) << "channel " << c << " sum " << k;
      EXPECT_GT(magnitude, 1.0) << "channel " << c << " sum " << k;
    }
}

// fc2's product and gradients as the fused kernel (fc2_loss) forms them, against their
// definitions summed in float64: each an fp32 sum of fused terms in order, within
// terms * 2^-24 * sum|term|. The gradient at fc1's output passes, scaled, only where fc1's
// output is positive (relu_dropout_backward_at's rule). The bias gradients are column sums.
TEST_F(CudaReference, Fc2ProductAndGradientsMatchTheirDefinitions) {
  constexpr std::uint32_t kBatch = 37;
  constexpr int kIn = kHidden, kOut = kClasses;
  std::vector<float> h = uniform(std::size_t{kBatch} * kIn, -1, 2, 51);
  for (float& v : h) v = v < 0 ? 0.0f : v;
  const std::vector<float> w = uniform(std::size_t{kOut} * kIn, -0.2f, 0.2f, 52);
  const std::vector<float> dl = uniform(std::size_t{kBatch} * kOut, -0.1f, 0.1f, 53);
  // `got` against scale * the float64 sum of term(0 .. count-1), within count * 2^-24 * scale * sum|term|.
  const auto within = [](float got, int count, const auto& term, double scale, const char* what, std::size_t at) {
    double value = 0, magnitude = 0;
    for (int t = 0; t < count; ++t) {
      const double v = term(t);
      value += v;
      magnitude += std::abs(v);
    }
    EXPECT_NEAR(got, scale * value, count * 0x1p-24 * scale * magnitude) << what << " " << at;
  };
  const int rows = static_cast<int>(kBatch);
  for (std::uint32_t r = 0; r < kBatch; ++r)
    for (int k = 0; k < kOut; ++k)
      within(cuda::fc2_product_at(h.data(), w.data(), r, k), kIn,
             [&](int i) { return double{h[r * kIn + i]} * w[k * kIn + i]; }, 1.0, "z", r * kOut + k);
  for (int j = 0; j < kOut * kIn; ++j)
    within(cuda::fc2_weight_grad_at(dl.data(), h.data(), kBatch, j), rows,
           [&](int r) { return double{dl[r * kOut + j / kIn]} * h[r * kIn + j % kIn]; }, 1.0, "dw", j);
  for (int k = 0; k < kOut; ++k)
    within(cuda::column_sum_at(dl.data(), kBatch, kOut, k), rows, [&](int r) { return double{dl[r * kOut + k]}; },
           1.0, "db", k);
  constexpr float kScale = 2.0f;
  std::size_t passed = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    const float got = cuda::fc2_input_grad_at(dl.data(), w.data(), h.data(), i, kScale);
    if (h[i] > 0) {
      within(got, kOut, [&](int k) { return double{dl[i / kIn * kOut + k]} * w[k * kIn + i % kIn]; }, kScale, "dh",
             i);
      ++passed;
    } else {
      ASSERT_EQ(got, 0.0f) << "dh " << i << " where fc1's output is 0";
    }
  }
  EXPECT_GT(passed, h.size() / 2);
  EXPECT_LT(passed, h.size() * 3 / 4);
  // fc1's bias gradient: the columns of the gradient at its output.
  for (int c = 0; c < kIn; ++c)
    within(cuda::column_sum_at(h.data(), kBatch, kIn, c), rows, [&](int r) { return double{h[r * kIn + c]}; }, 1.0,
           "column", c);
}

// Tolerance: the GPU's row math is fp32 (expf, logf, a 10-term sum), the CPU's fp64 rounded
// once; the difference stays below 1e-5 of max(1, |value|) (a few ulp of log_sum).
TEST_F(CudaReference, LogSoftmaxNllMatchesTheCpu) {
  constexpr std::uint32_t kBatch = 64;
  const std::vector<float> z = grid_values(kBatch * cuda::kLogits, 12), bias = grid_values(cuda::kLogits, 13);
  std::vector<std::uint8_t> labels(kBatch);
  std::mt19937 rng(14);
  for (std::uint32_t r = 0; r < kBatch; ++r) {  // a quarter labelled with their first maximum
    const float* row = z.data() + r * cuda::kLogits;
    std::vector<float> logit(row, row + cuda::kLogits);
    for (int k = 0; k < cuda::kLogits; ++k) logit[k] += bias[k];
    labels[r] = r % 4 ? rng() % cuda::kLogits : std::max_element(logit.begin(), logit.end()) - logit.begin();
  }
  std::vector<float> logits(z.size()), cpu_lp(z.size()), cpu_dl(z.size()), lp(z.size()), dl(z.size());
  for (std::size_t i = 0; i < z.size(); ++i) logits[i] = z[i] + bias[i % cuda::kLogits];
  cpu::LossSums sums;
  cpu::log_softmax_nll(logits.data(), labels.data(), kBatch, 128.0f, cpu_lp.data(), cpu_dl.data(), sums);
  double loss = 0, correct = 0, loss_tolerance = 0;
  for (std::uint32_t r = 0; r < kBatch; ++r) {
    const cuda::RowLoss row = cuda::log_softmax_nll_at(z.data(), bias.data(), labels.data(), r, 128.0f, lp.data(),
                                                       dl.data());
    loss += row.nll;
    correct += row.correct;
    loss_tolerance += 1e-5 * std::max(1.0f, row.nll);
  }
  for (std::size_t i = 0; i < z.size(); ++i) {
    ASSERT_NEAR(lp[i], cpu_lp[i], 1e-5 * std::max(1.0f, std::abs(cpu_lp[i]))) << "logprob " << i;
    ASSERT_NEAR(dl[i], cpu_dl[i], 1e-5 / 128.0) << "dlogit " << i;
  }
  EXPECT_NEAR(loss, sums.loss, loss_tolerance);
  EXPECT_EQ(correct, sums.correct);
  EXPECT_GE(correct, kBatch / 4);  // ties resolved to the first maximum, as the labels assume
  EXPECT_LT(correct, kBatch);
}

// A NaN logit: both sides give NaN for that row and keep the first finite maximum.
TEST_F(CudaReference, LogSoftmaxNllPassesNaN) {
  const float z[cuda::kLogits] = {0.5f, 2.0f, kNaN, 2.0f, -1, 0, 0, 0, 0, 0}, bias[cuda::kLogits] = {};
  const std::uint8_t label = 1;
  float cpu_lp[cuda::kLogits], cpu_dl[cuda::kLogits], lp[cuda::kLogits], dl[cuda::kLogits];
  cpu::LossSums sums;
  cpu::log_softmax_nll(z, &label, 1, 1.0f, cpu_lp, cpu_dl, sums);
  const cuda::RowLoss row = cuda::log_softmax_nll_at(z, bias, &label, 0, 1.0f, lp, dl);
  for (int k = 0; k < cuda::kLogits; ++k) {
    EXPECT_TRUE(std::isnan(lp[k]) && std::isnan(cpu_lp[k])) << k;
    EXPECT_TRUE(std::isnan(dl[k]) && std::isnan(cpu_dl[k])) << k;
  }
  EXPECT_TRUE(std::isnan(row.nll) && std::isnan(sums.loss));
  EXPECT_TRUE(row.correct);
  EXPECT_EQ(sums.correct, 1);
}

// Bitwise against the CPU's every variant: the update is built without fused multiply-adds
// (src/cpu/meson.build), so SSE2, AVX2 and AVX-512 round every product and sum as
// update_at does.
TEST_F(CudaReference, OptimizerUpdatesMatchTheCpu) {
  constexpr std::size_t kCount = 4099;  // not a multiple of any vector width
  const std::vector<float> p0 = uniform(kCount, -1, 1, 15), g = uniform(kCount, -0.1f, 0.1f, 16);
  const std::vector<float> m0 = uniform(kCount, -0.1f, 0.1f, 17), v0 = uniform(kCount, 0.0f, 0.01f, 18);
  std::vector<OptimizerOptions> cases;
  for (const float momentum : {0.9f, 0.0f})
    for (const float decay : {0.0f, 5e-4f}) cases.push_back({0.05f, momentum, decay});
  cases.push_back({0.05f, 0.9f, 5e-4f, true});
  for (const OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kAdadelta})
    for (const float decay : {0.0f, 1e-2f}) cases.push_back({1e-3, 0.0, decay, false, kind});
  for (const OptimizerOptions& options : cases)
    for (const std::uint64_t applied : {0, 7}) {
      SCOPED_TRACE(testing::Message() << optimizer_name(options.kind) << " momentum " << options.momentum
                                      << " nesterov " << options.nesterov << " weight decay " << options.weight_decay
                                      << " after " << applied << " updates");
      const UpdateScalars scalars = update_scalars(options, base_values(options), applied);
      // Adadelta's first buffer is a mean of squares too.
      const std::vector<float>& first = options.kind == OptimizerKind::kAdadelta ? v0 : m0;
      std::vector<float> p = p0, m = first, v = v0, cpu_p = p0, cpu_m = first, cpu_v = v0;
      cpu::element_kernels(cpu::Isa::kPortable)
          .optimizer_update(cpu_p.data(), g.data(), cpu_m.data(), cpu_v.data(), kCount, scalars);
      // Every vector variant this CPU runs, each bitwise equal to the portable one.
      for (const cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
        if (static_cast<int>(isa) > static_cast<int>(cpu::kernel_isa())) continue;
        std::vector<float> isa_p = p0, isa_m = first, isa_v = v0;
        cpu::element_kernels(isa).optimizer_update(isa_p.data(), g.data(), isa_m.data(), isa_v.data(), kCount,
                                                   scalars);
        for (std::size_t i = 0; i < kCount; ++i) {
          ASSERT_TRUE(same(isa_p[i], cpu_p[i])) << cpu::isa_name(isa) << " param " << i;
          ASSERT_TRUE(same(isa_m[i], cpu_m[i])) << cpu::isa_name(isa) << " first buffer " << i;
          ASSERT_TRUE(same(isa_v[i], cpu_v[i])) << cpu::isa_name(isa) << " second buffer " << i;
        }
      }
      std::size_t moved = 0;
      for (std::size_t i = 0; i < kCount; ++i) {
        cuda::update_at(p.data(), g.data(), m.data(), v.data(), i, scalars);
        ASSERT_TRUE(same(p[i], cpu_p[i])) << "param " << i << ": " << p[i] << " vs " << cpu_p[i];
        ASSERT_TRUE(same(m[i], cpu_m[i])) << "first buffer " << i;
        ASSERT_TRUE(same(v[i], cpu_v[i])) << "second buffer " << i;
        if (options.kind == OptimizerKind::kSgd && options.momentum == 0.0) {
          ASSERT_TRUE(same(m[i], first[i])) << "momentum 0 keeps no buffer: " << i;
        }
        moved += p[i] != p0[i];
      }
      EXPECT_GT(moved, kCount / 2);
    }
}

}  // namespace
}  // namespace mnist_mt
