// The own CPU kernels with a variant per instruction set (src/cpu/conv1.cpp, pool.cpp,
// conv2_backward.cpp, activation.cpp, update.cpp, norm.cpp) against scalar float64
// references written from the definitions, for every instruction set this CPU runs: the
// process only ever uses one of them (isa.hpp), so the others are checked nowhere else.
// loss.cpp and input.cpp are checked bitwise by test_cuda_reference, reduce.cpp by
// test_communicator.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <dnnl.hpp>

#include "cpu/conv1.hpp"
#include "cpu/conv2_forward.hpp"
#include "cpu/conv2_backward.hpp"
#include "cpu/isa.hpp"
#include "cpu/kernels.hpp"
#include "conv_reference.hpp"
#include "cpu/pool.hpp"
#include "kernel_inputs.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cpu {

// For gtest's messages about a parameter (found by ADL, so outside the anonymous namespace).
void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }

namespace {

using testing_inputs::blocked;
using testing_inputs::same;
using testing_inputs::uniform;
using testing_reference::ConvGeometry;
using testing_reference::conv_reference;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr std::size_t kIn1 = kImageSide, kOut1 = kConv1Side, kIn2 = kConv2Side, kOut2 = kPoolSide;
constexpr std::uint8_t kUnwritten = 0xa5;  // an argmax value the kernels never write
const std::uint32_t kBatches[] = {1, 3, 64};

bool cpu_runs(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case Isa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kPortable: break;
  }
  return true;
}

// A tensor moved between the NCHW layout (the references') and nChw{B}c (the kernels').
enum class Into { kNchw, kBlocked };
template <typename T>
std::vector<T> relayout(const std::vector<T>& v, Into into, std::size_t batch, std::size_t channels, std::size_t side,
                        std::size_t block) {
  std::vector<T> out(v.size());
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t c = 0; c < channels; ++c)
      for (std::size_t y = 0; y < side; ++y)
        for (std::size_t x = 0; x < side; ++x) {
          const std::size_t plain = ((n * channels + c) * side + y) * side + x;
          const std::size_t at = blocked(n, c, y, x, channels, side, block);
          if (into == Into::kNchw) out[plain] = v[at];
          else out[at] = v[plain];
        }
  return out;
}

class KernelTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!cpu_runs(GetParam())) GTEST_SKIP() << "this CPU lacks " << isa_name(GetParam());
  }
  Isa isa() const { return GetParam(); }
  std::size_t block() const { return channel_block(GetParam()); }
};

// One suite per operation, named as in test_cuda_kernels (Conv2: conv2_backward.cpp and
// conv2_winograd.cpp), each run on every instruction set; Input and Loss have one variant.
// --gtest_filter '*Pool*' finds pool.cpp's tests here (PoolReference too) and pool.cu's in
// test_cuda_kernels.
class Conv1 : public KernelTest {};
class Pool : public KernelTest {};
class Conv2 : public KernelTest {};
class Activation : public KernelTest {};
class Update : public KernelTest {};
class Norm : public KernelTest {};
class Factors : public KernelTest {};
class Fc : public KernelTest {};

// ---- conv1 ----

struct Conv1Case {
  std::vector<float> x, w, b;
};

// Inputs in the range of normalised MNIST pixels, PyTorch's initial weight range; two
// channels with a bias so negative that all their outputs are cut by the ReLU.
Conv1Case conv1_case(std::uint32_t batch, std::uint32_t seed) {
  constexpr float kBound = 1 / 3.0f;  // 1/sqrt(fan_in)
  Conv1Case c{uniform(batch * kIn1 * kIn1, -0.5f, 2.8f, seed), uniform(kConv1Channels * 9, -kBound, kBound, seed + 1),
              uniform(kConv1Channels, -kBound, kBound, seed + 2)};
  c.b[5] = -50;
  c.b[kConv1Channels - 1] = -50;
  return c;
}

ConvGeometry conv1_geometry(std::uint32_t batch) { return {batch, 1, kConv1Channels, kIn1, 3}; }

// conv1's pre-activations b + w*x in float64, NCHW.
std::vector<double> conv1_pre(const Conv1Case& in, std::uint32_t batch) {
  std::vector<double> pre = conv_reference(conv1_geometry(batch), in.x, in.w, {}).y.value;
  for (std::size_t i = 0; i < pre.size(); ++i) pre[i] += in.b[i / (kOut1 * kOut1) % kConv1Channels];
  return pre;
}

TEST_P(Conv1, ForwardIsReluOfConvolution) {
  for (std::uint32_t batch : kBatches) {
    const Conv1Case in = conv1_case(batch, 10 + batch);
    std::vector<float> out(batch * kConv1Channels * kOut1 * kOut1, kNaN);
    conv1_kernels(isa()).forward(in.x.data(), in.w.data(), in.b.data(), batch, out.data());
    const std::vector<double> pre_nchw = conv1_pre(in, batch);
    const std::vector<double> pre = relayout(pre_nchw, Into::kBlocked, batch, kConv1Channels, kOut1, block());

    std::size_t bad = 0, positive = 0, cut = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double want = std::max(pre[i], 0.0);
      // Clearly negative pre-activations give exactly 0, not a small value.
      const bool ok = pre[i] < -1e-5 ? out[i] == 0 : std::abs(out[i] - want) <= 1e-5 * std::abs(want) + 1e-6;
      positive += pre[i] > 1e-5;
      cut += pre[i] < -1e-5;
      if (!ok && ++bad <= 5)
        ADD_FAILURE() << "batch " << batch << " blocked element " << i << ": got " << out[i] << ", want " << want
                      << " (pre-activation " << pre[i] << ")";
    }
    EXPECT_EQ(bad, 0u) << "batch " << batch;
    // Both sides of the ReLU were exercised.
    EXPECT_GT(positive, out.size() / 4) << "batch " << batch;
    EXPECT_GT(cut, out.size() / 8) << "batch " << batch;
  }
}

// Ours against `want` within 1e-5 relative per element plus 1e-5 of the largest |want|:
// conv1's kernel sums each image's 676 positions in fp32; conv2's Winograd F(4x4, 3x3)
// rounds more than a direct sum (its transforms scale by up to 8) over thousands of terms.
void expect_close(const std::vector<float>& ours, const std::vector<double>& want, const std::string& what) {
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  ASSERT_GT(scale, 0) << what;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < ours.size(); ++i)
    if (!(std::abs(ours[i] - want[i]) <= 1e-5 * (std::abs(want[i]) + scale)) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << ours[i] << ", want " << want[i];
  EXPECT_EQ(bad, 0u) << what;
}

TEST_P(Conv1, BackwardWeightsSumsGradientWhereOutputIsPositive) {
  for (std::uint32_t batch : kBatches) {
    const Conv1Case in = conv1_case(batch, 20 + batch);
    const std::size_t count = batch * kConv1Channels * kOut1 * kOut1;
    // out: the forward's output (the float64 reference rounded), in the blocked layout.
    const std::vector<double> pre =
        relayout(conv1_pre(in, batch), Into::kBlocked, batch, kConv1Channels, kOut1, block());
    std::vector<float> out(count), masked(count);
    const std::vector<float> d_out = uniform(count, -1, 1, 30 + batch);
    for (std::size_t i = 0; i < count; ++i) {
      out[i] = static_cast<float>(std::max(pre[i], 0.0));
      masked[i] = out[i] > 0 ? d_out[i] : 0.0f;
    }
    const auto ref = conv_reference(conv1_geometry(batch), in.x, in.w,
                                    relayout(masked, Into::kNchw, batch, kConv1Channels, kOut1, block()));
    const auto& want_dw = ref.dw.value;
    const auto& want_db = ref.db.value;

    std::vector<float> dw(want_dw.size(), kNaN), db(want_db.size(), kNaN);
    conv1_kernels(isa()).backward_weights(in.x.data(), out.data(), d_out.data(), batch, dw.data(), db.data());
    expect_close(dw, want_dw, "batch " + std::to_string(batch) + " dw");
    expect_close(db, want_db, "batch " + std::to_string(batch) + " db");
    // The channels the ReLU cuts entirely get no gradient at all.
    EXPECT_EQ(db[5], 0.0f);
    for (std::size_t k = 0; k < 9; ++k) EXPECT_EQ(dw[5 * 9 + k], 0.0f) << "tap " << k;
  }
}

// ---- ReLU + 2x2 max pooling ----

// A window's values in row-major order (0,0), (0,1), (1,0), (1,1).
using Window = std::array<float, 4>;

struct Pooled {
  float value;
  std::uint8_t argmax;
};

// PyTorch's max_pool2d of ReLU: the first maximum in row-major order gets the gradient,
// unless the ReLU cuts it; a NaN counts as a maximum (the last one wins, as in PyTorch's
// CPU kernel), passes the ReLU as NaN and gets no gradient from it.
Pooled pool_reference(const Window& v) {
  std::size_t first = 0;
  for (std::size_t k = 1; k < 4; ++k)
    if (v[k] > v[first] || std::isnan(v[k])) first = k;
  if (std::isnan(v[first])) return {v[first], kPoolNoGradient};
  if (!(v[first] > 0)) return {0.0f, kPoolNoGradient};
  return {v[first], static_cast<std::uint8_t>(first)};
}

struct SpecialWindow {
  Window v;
  Pooled want;
};

const SpecialWindow kSpecial[] = {
    // Ties: the first maximum wins.
    {{0.5f, 0.5f, 0.2f, 0.5f}, {0.5f, 0}},
    {{0.1f, 0.7f, 0.7f, 0.7f}, {0.7f, 1}},
    {{0.1f, 0.2f, 0.9f, 0.9f}, {0.9f, 2}},
    {{0.3f, 0.3f, 0.3f, 0.3f}, {0.3f, 0}},
    {{-1.0f, 0.2f, -3.0f, 0.4f}, {0.4f, 3}},
    // All four <= 0, the maximum exactly 0 among them: 0, and no gradient.
    {{-1.0f, -2.0f, -0.5f, -3.0f}, {0.0f, kPoolNoGradient}},
    {{-0.5f, -0.5f, -0.5f, -0.5f}, {0.0f, kPoolNoGradient}},
    {{0.0f, -1.0f, 0.0f, -2.0f}, {0.0f, kPoolNoGradient}},
    {{-1.0f, -2.0f, -3.0f, 0.0f}, {0.0f, kPoolNoGradient}},
    {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, kPoolNoGradient}},
    {{-0.0f, 0.0f, -0.0f, -1.0f}, {0.0f, kPoolNoGradient}},
    // Tiny but positive, a subnormal too: the ReLU passes it.
    {{-1.0f, 1e-30f, -2.0f, 0.0f}, {1e-30f, 1}},
    {{-1.0f, -2.0f, 1e-40f, 0.0f}, {1e-40f, 2}},
    // NaN: the maximum, NaN out, no gradient.
    {{0.5f, kNaN, 0.2f, 0.1f}, {kNaN, kPoolNoGradient}},
    {{kNaN, 0.9f, -1.0f, 0.0f}, {kNaN, kPoolNoGradient}},
};

struct PoolCase {
  std::vector<float> in;     // batch x 64/B x 24 x 24 x B
  std::vector<Pooled> want;  // batch x 64 x 12 x 12
};

// Random values of both signs, with kSpecial's windows written over some of them (at
// different channels, lanes and positions, in the first and the last image).
PoolCase pool_case(std::uint32_t batch, std::size_t block, std::uint32_t seed) {
  PoolCase p{uniform(batch * kConv2Channels * kIn2 * kIn2, -1, 1, seed), {}};
  const auto at = [&](std::size_t n, std::size_t c, std::size_t y, std::size_t x) {
    return blocked(n, c, y, x, kConv2Channels, kIn2, block);
  };
  for (std::size_t i = 0; i < std::size(kSpecial); ++i) {
    const std::size_t n = i % 2 == 0 ? 0 : batch - 1, c = (i * 7) % kConv2Channels, py = i % kOut2,
                      px = (i * 5) % kOut2;
    for (std::size_t k = 0; k < 4; ++k) p.in[at(n, c, 2 * py + k / 2, 2 * px + k % 2)] = kSpecial[i].v[k];
  }
  p.want.resize(batch * kFlat);
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t c = 0; c < kConv2Channels; ++c)
      for (std::size_t py = 0; py < kOut2; ++py)
        for (std::size_t px = 0; px < kOut2; ++px) {
          Window v;
          for (std::size_t k = 0; k < 4; ++k) v[k] = p.in[at(n, c, 2 * py + k / 2, 2 * px + k % 2)];
          p.want[((n * kConv2Channels + c) * kOut2 + py) * kOut2 + px] = pool_reference(v);
        }
  return p;
}

TEST(PoolReference, SpecialWindows) {
  for (const SpecialWindow& s : kSpecial) {
    const Pooled got = pool_reference(s.v);
    EXPECT_TRUE(same(got.value, s.want.value)) << got.value << " vs " << s.want.value;
    EXPECT_EQ(got.argmax, s.want.argmax);
  }
}

TEST_P(Pool, ForwardIsReluOfFirstWindowMaximum) {
  for (std::uint32_t batch : kBatches) {
    const PoolCase p = pool_case(batch, block(), 40 + batch);
    std::vector<float> out(batch * kFlat, kNaN);
    std::vector<std::uint8_t> argmax(batch * kFlat, kUnwritten);
    pool_kernels(isa()).forward(p.in.data(), batch, out.data(), argmax.data());

    std::size_t bad = 0, cut = 0;
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t c = 0; c < kConv2Channels; ++c)
        for (std::size_t py = 0; py < kOut2; ++py)
          for (std::size_t px = 0; px < kOut2; ++px) {
            const std::size_t flat = ((n * kConv2Channels + c) * kOut2 + py) * kOut2 + px;
            const Pooled want = p.want[flat];
            const float got = out[flat];
            const std::uint8_t got_arg = argmax[blocked(n, c, py, px, kConv2Channels, kOut2, block())];
            cut += want.argmax == kPoolNoGradient;
            if ((!same(got, want.value) || got_arg != want.argmax) && ++bad <= 5)
              ADD_FAILURE() << "batch " << batch << " (n, c, py, px) = (" << n << ", " << c << ", " << py << ", " << px
                            << "): got " << got << " argmax " << int{got_arg} << ", want " << want.value
                            << " argmax " << int{want.argmax};
          }
    EXPECT_EQ(bad, 0u) << "batch " << batch;
    EXPECT_GE(cut, std::size(kSpecial) / 2) << "batch " << batch;  // windows the ReLU cuts occurred
  }
}

TEST_P(Pool, ForwardOfAllNegativeInputIsZeroWithoutGradient) {
  const std::uint32_t batch = 3;
  const std::vector<float> in = uniform(batch * kConv2Channels * kIn2 * kIn2, -2, -1e-3f, 50);
  std::vector<float> out(batch * kFlat, kNaN);
  std::vector<std::uint8_t> argmax(batch * kFlat, kUnwritten);
  pool_kernels(isa()).forward(in.data(), batch, out.data(), argmax.data());
  EXPECT_EQ(std::count(out.begin(), out.end(), 0.0f), static_cast<std::ptrdiff_t>(out.size()));
  EXPECT_EQ(std::count(argmax.begin(), argmax.end(), kPoolNoGradient), static_cast<std::ptrdiff_t>(argmax.size()));
}

// d_in at (n, c, y, x), for d_out (flatten order) routed by argmax (blocked).
float pool_backward_reference(const std::vector<float>& d_out, const std::vector<std::uint8_t>& argmax,
                              std::size_t block, std::size_t n, std::size_t c, std::size_t y, std::size_t x) {
  const std::size_t py = y / 2, px = x / 2, k = (y % 2) * 2 + x % 2;
  if (argmax[blocked(n, c, py, px, kConv2Channels, kOut2, block)] != k) return 0.0f;
  return d_out[((n * kConv2Channels + c) * kOut2 + py) * kOut2 + px];
}

// Compares every element of d_in (prefilled with NaN by the caller) with the reference.
void expect_pool_backward(const std::vector<float>& d_in, const std::vector<float>& d_out,
                          const std::vector<std::uint8_t>& argmax, std::uint32_t batch, std::size_t block,
                          const std::string& what) {
  std::size_t bad = 0;
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t c = 0; c < kConv2Channels; ++c)
      for (std::size_t y = 0; y < kIn2; ++y)
        for (std::size_t x = 0; x < kIn2; ++x) {
          const float want = pool_backward_reference(d_out, argmax, block, n, c, y, x);
          const float got = d_in[blocked(n, c, y, x, kConv2Channels, kIn2, block)];
          if (!(got == want) && ++bad <= 5)
            ADD_FAILURE() << what << " (n, c, y, x) = (" << n << ", " << c << ", " << y << ", " << x << "): got " << got
                          << ", want " << want << " (argmax "
                          << int{argmax[blocked(n, c, y / 2, x / 2, kConv2Channels, kOut2, block)]} << ")";
        }
  EXPECT_EQ(bad, 0u) << what;
}

TEST_P(Pool, BackwardRoutesGradientToArgmaxOnly) {
  for (std::uint32_t batch : kBatches) {
    const std::vector<float> d_out = uniform(batch * kFlat, -1, 1, 60 + batch);
    // Every argmax value, kPoolNoGradient included, at random.
    std::mt19937 rng(70 + batch);
    std::vector<std::uint8_t> argmax(batch * kFlat);
    for (auto& a : argmax) a = static_cast<std::uint8_t>(rng() % (kPoolNoGradient + 1));
    std::vector<float> d_in(batch * kConv2Channels * kIn2 * kIn2, kNaN);
    pool_kernels(isa()).backward(d_out.data(), argmax.data(), batch, d_in.data());
    expect_pool_backward(d_in, d_out, argmax, batch, block(), "batch " + std::to_string(batch));
  }
}

// Forward then backward through the kernels' own argmax: the gradient reaches the input
// element that produced each positive pooled value, and nothing else.
TEST_P(Pool, BackwardAfterForwardReachesTheMaximum) {
  for (std::uint32_t batch : kBatches) {
    const PoolCase p = pool_case(batch, block(), 80 + batch);
    std::vector<float> out(batch * kFlat);
    std::vector<std::uint8_t> argmax(batch * kFlat);
    pool_kernels(isa()).forward(p.in.data(), batch, out.data(), argmax.data());
    const std::vector<float> d_out = uniform(batch * kFlat, -1, 1, 90 + batch);
    std::vector<float> d_in(p.in.size(), kNaN);
    pool_kernels(isa()).backward(d_out.data(), argmax.data(), batch, d_in.data());
    expect_pool_backward(d_in, d_out, argmax, batch, block(), "batch " + std::to_string(batch));
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (p.want[i].argmax == kPoolNoGradient) continue;
      const std::size_t n = i / kFlat, c = i / (kOut2 * kOut2) % kConv2Channels, py = i / kOut2 % kOut2,
                        px = i % kOut2, k = p.want[i].argmax;
      ASSERT_EQ(d_in[blocked(n, c, 2 * py + k / 2, 2 * px + k % 2, kConv2Channels, kIn2, block())], d_out[i])
          << "batch " << batch << " pooled element " << i;
    }
  }
}

// ---- conv2's backward by Winograd ----

TEST_P(Conv2, WinogradEqualsDirectGradients) {
  constexpr std::size_t kIc = kConv1Channels, kOc = kConv2Channels, kSide = kConv1Side, kOut = kConv2Side;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const dnnl::stream stream(engine);
  const std::size_t B = block();
  // 1, 3 and 5 run in chunks of one image, 4 in chunks of two.
  for (std::uint32_t batch : {1u, 3u, 4u, 5u}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const std::vector<float> a1 = uniform(batch * kIc * kSide * kSide, 0.0f, 2.0f, 1 + batch);
    const std::vector<float> d_a2 = uniform(batch * kOc * kOut * kOut, -1.0f, 1.0f, 2 + batch);
    const std::vector<float> w = uniform(kOc * kIc * 9, -0.06f, 0.06f, 3 + batch);
    std::vector<float> dw(w.size(), kNaN), db(kOc, kNaN), d_a1(a1.size(), kNaN);
    Conv2WinogradBackward conv2(engine, batch, isa());
    conv2.backward(stream, a1.data(), w.data(), d_a2.data(), dw.data(), db.data(), d_a1.data());

    const auto ref = conv_reference({batch, kIc, kOc, kSide, 3}, relayout(a1, Into::kNchw, batch, kIc, kSide, B), w,
                                    relayout(d_a2, Into::kNchw, batch, kOc, kOut, B));
    const auto& want_dw = ref.dw.value;
    const auto& want_db = ref.db.value;
    const std::vector<double> want_da1 = relayout(ref.dx.value, Into::kBlocked, batch, kIc, kSide, B);
    expect_close(dw, want_dw, "dw");
    expect_close(db, want_db, "db");
    expect_close(d_a1, want_da1, "d_a1");
  }
}

// conv2's forward by Winograd F(2x2, 3x3) (the step's where oneDNN's would be direct)
// against the float64 direct convolution plus bias, on every ISA; its rounding is bounded
// as a direct fp32 sum's, by each output's sum of |terms| (a few units of fp32 rounding of it).
TEST_P(Conv2, WinogradForwardEqualsDirect) {
  constexpr std::size_t kIc = kConv1Channels, kOc = kConv2Channels, kSide = kConv1Side, kOut = kConv2Side;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const dnnl::stream stream(engine);
  const std::size_t B = block();
  for (std::uint32_t batch : {1u, 3u}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const std::vector<float> a1 = uniform(batch * kIc * kSide * kSide, 0.0f, 2.0f, 21 + batch);
    const std::vector<float> w = uniform(kOc * kIc * 9, -0.06f, 0.06f, 22 + batch);
    const std::vector<float> bias = uniform(kOc, -0.1f, 0.1f, 23 + batch);
    std::vector<float> a2(batch * kOc * kOut * kOut, kNaN);
    Conv2WinogradForward conv2(engine, batch, isa());
    conv2.forward(stream, a1.data(), w.data(), bias.data(), a2.data());

    const auto ref = conv_reference({batch, kIc, kOc, kSide, 3}, relayout(a1, Into::kNchw, batch, kIc, kSide, B), w, {});
    std::size_t bad = 0;
    for (std::size_t i = 0; i < ref.y.value.size(); ++i) {
      const std::size_t k = i / (kOut * kOut) % kOc;
      const double want = ref.y.value[i] + bias[k];
      const float got = a2[blocked(i, kOc, kOut, B)];
      if (!(std::abs(got - want) <= 1e-6 * (ref.y.magnitude[i] + std::abs(bias[k]))) && ++bad <= 5)
        ADD_FAILURE() << "output " << i << ": got " << got << ", want " << want;
    }
    EXPECT_EQ(bad, 0u);
  }
}

// The step's pass: the pool's backward fused into the output-gradient transform gives
// the bits of the pool's backward followed by backward() on the map it writes. Every
// argmax value at random (kPoolNoGradient too); chunks of one image and of two.
TEST_P(Conv2, PooledEqualsPoolBackwardThenBackward) {
  constexpr std::size_t kIc = kConv1Channels, kOc = kConv2Channels, kSide = kConv1Side, kOut = kConv2Side;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const dnnl::stream stream(engine);
  for (std::uint32_t batch : {1u, 3u, 4u}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const std::vector<float> a1 = uniform(batch * kIc * kSide * kSide, 0.0f, 2.0f, 11 + batch);
    const std::vector<float> d_pool = uniform(batch * kFlat, -1.0f, 1.0f, 12 + batch);
    const std::vector<float> w = uniform(kOc * kIc * 9, -0.06f, 0.06f, 13 + batch);
    std::mt19937 rng(14 + batch);
    std::vector<std::uint8_t> argmax(batch * kFlat);
    for (auto& a : argmax) a = static_cast<std::uint8_t>(rng() % (kPoolNoGradient + 1));
    Conv2WinogradBackward conv2(engine, batch, isa());

    std::vector<float> d_a2(batch * kOc * kOut * kOut, kNaN);
    pool_kernels(isa()).backward(d_pool.data(), argmax.data(), batch, d_a2.data());
    std::vector<float> dw(w.size(), kNaN), db(kOc, kNaN), d_a1(a1.size(), kNaN);
    conv2.backward(stream, a1.data(), w.data(), d_a2.data(), dw.data(), db.data(), d_a1.data());
    std::vector<float> fused_dw(w.size(), kNaN), fused_db(kOc, kNaN), fused_d_a1(a1.size(), kNaN);
    conv2.backward_pooled(stream, a1.data(), w.data(), d_pool.data(), argmax.data(), fused_dw.data(), fused_db.data(),
                          fused_d_a1.data());

    EXPECT_EQ(0, std::memcmp(dw.data(), fused_dw.data(), dw.size() * sizeof(float))) << "dw";
    EXPECT_EQ(0, std::memcmp(db.data(), fused_db.data(), db.size() * sizeof(float))) << "db";
    EXPECT_EQ(0, std::memcmp(d_a1.data(), fused_d_a1.data(), d_a1.size() * sizeof(float))) << "d_a1";
    // Not vacuous: the gradients are not all zero.
    EXPECT_GT(*std::max_element(fused_db.begin(), fused_db.end()), 0.0f);
  }
}

// ---- input and loss: scalar, the same on every ISA ----

// Each of the 256 pixel values becomes torchvision's ToTensor + Normalize in fp32, and
// within 1e-6 of the float64 value.
TEST(Input, NormaliseIsToTensorThenNormalize) {
  std::vector<std::uint8_t> pixels(256);
  for (std::size_t v = 0; v < pixels.size(); ++v) pixels[v] = static_cast<std::uint8_t>(255 - v);
  std::vector<float> out(pixels.size(), kNaN);
  normalise_images(pixels.data(), pixels.size(), out.data());
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    const float want = (static_cast<float>(pixels[i]) / 255.0f - kInputMean) / kInputStd;
    ASSERT_EQ(out[i], want) << "pixel " << int{pixels[i]};
    const double exact = (pixels[i] / 255.0 - 0.1307) / 0.3081;  // torchvision's MNIST normalisation
    EXPECT_NEAR(out[i], exact, 1e-6 * std::max(1.0, std::abs(exact))) << "pixel " << int{pixels[i]};
  }
}

// log_softmax, NLL, its gradient and the argmax of each row against float64; a row with
// two equal maxima counts the first, as torch.argmax.
TEST(Loss, LogSoftmaxNllAndGradientMatchFloat64) {
  constexpr std::uint32_t kRows = 6;
  std::vector<float> logits = uniform(kRows * kClasses, -8.0f, 8.0f, 91);
  logits[5 * kClasses + 2] = logits[5 * kClasses + 7] = 20.0f;  // row 5: a tie, label 7
  const std::vector<std::uint8_t> labels{3, 0, 9, 4, 4, 7};
  const float denominator = 4.0f;
  std::vector<float> logp(logits.size(), kNaN), dlogits(logits.size(), kNaN);
  LossSums sums;
  log_softmax_nll(logits.data(), labels.data(), kRows, denominator, logp.data(), dlogits.data(), sums);
  double want_loss = 0, want_correct = 0;
  for (std::uint32_t n = 0; n < kRows; ++n) {
    const float* x = logits.data() + n * kClasses;
    double m = x[0];
    std::size_t best = 0;
    for (std::size_t k = 1; k < kClasses; ++k)
      if (x[k] > x[best]) best = k, m = x[k];
    double sum = 0;
    for (std::size_t k = 0; k < kClasses; ++k) sum += std::exp(x[k] - m);
    for (std::size_t k = 0; k < kClasses; ++k) {
      const double lp = x[k] - m - std::log(sum);
      const double d = (std::exp(lp) - (k == labels[n] ? 1.0 : 0.0)) / denominator;
      EXPECT_NEAR(logp[n * kClasses + k], lp, 1e-6 * std::max(1.0, std::abs(lp))) << "row " << n << " class " << k;
      EXPECT_NEAR(dlogits[n * kClasses + k], d, 1e-7) << "row " << n << " class " << k;
    }
    want_loss -= x[labels[n]] - m - std::log(sum);
    want_correct += best == labels[n] ? 1 : 0;
  }
  EXPECT_NEAR(sums.loss, want_loss, 1e-5 * want_loss);
  EXPECT_EQ(sums.correct, want_correct);
  // The tie alone: the first maximum, class 2, is the prediction.
  for (const std::uint8_t label : {std::uint8_t{7}, std::uint8_t{2}}) {
    LossSums tie;
    log_softmax_nll(logits.data() + 5 * kClasses, &label, 1, denominator, logp.data(), dlogits.data(), tie);
    EXPECT_EQ(tie.correct, label == 2 ? 1.0 : 0.0) << "label " << int{label};
  }
}

// ---- dropout, its backward with the ReLU's, SGD ----

// Each element is kept exactly when dropout_keep() says so, and then scaled by 1/(1-p):
// both dropout layers' streams and rates, and a rate of neither.
TEST_P(Activation, DropoutKeepsAsDropoutKeepAndScales) {
  const std::vector<std::uint32_t> samples{0, 3, 59999, 12345};
  const DropoutKey key{0xabcdef0123ull, 9};
  for (auto [stream, elements, p] : {std::tuple{RandomStream::kDropout0, 9216u, kDropout1},
                                     std::tuple{RandomStream::kDropout1, 128u, kDropout2},
                                     std::tuple{RandomStream::kDropout0, 70u, 0.3f},
                                     std::tuple{RandomStream::kDropout0, 100u, 0.9f},
                                     std::tuple{RandomStream::kDropout1, 200u, 0.5f},
                                     std::tuple{RandomStream::kDropout1, 70u, 0.3f}}) {
    const std::vector<float> x = uniform(samples.size() * elements, 0.5f, 2.0f, elements);
    std::vector<float> y = x;
    element_kernels(isa()).dropout_forward(key, samples.data(), static_cast<std::uint32_t>(samples.size()), stream,
                                           elements, p, y.data());
    const float scale = 1.0f / (1.0f - p);
    for (std::size_t n = 0; n < samples.size(); ++n)
      for (std::uint32_t e = 0; e < elements; ++e) {
        const std::size_t i = n * elements + e;
        const bool keep = dropout_keep(key.seed, key.epoch, samples[n], stream, e, p);
        ASSERT_EQ(y[i], keep ? x[i] * scale : 0.0f) << "element " << e << " of sample " << samples[n];
      }
  }
}

TEST_P(Activation, ReluDropoutBackwardPassesWhereOutputIsPositive) {
  for (std::size_t count : {1u, 15u, 16u, 1027u}) {  // tails shorter than a vector
    std::vector<float> out = uniform(count, -1, 1, 5 + count), d = uniform(count, -2, 2, 6 + count);
    out[0] = 0.0f;
    if (count > 2) out[count - 1] = kNaN;
    if (count > 3) out[1] = 2e-38f;  // tiny, but positive: it passes
    std::vector<float> got = d;
    element_kernels(isa()).relu_dropout_backward(out.data(), 2.0f, count, got.data());
    for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], out[i] > 0 ? d[i] * 2.0f : 0.0f) << count << " " << i;
  }
}

TEST_P(Update, SgdIsPyTorchsRule) {
  constexpr std::size_t kCount = 1003;
  const std::vector<float> p0 = uniform(kCount, -1, 1, 1), g = uniform(kCount, -1, 1, 2), m0 = uniform(kCount, -1, 1, 3);
  for (const float momentum : {0.9f, 0.0f})
    for (bool first : {true, false}) {
      const OptimizerOptions sgd{0.05f, momentum, 0.01f};
      std::vector<float> p = p0, m = m0;
      const UpdateScalars scalars = update_scalars(sgd, base_values(sgd), first ? 0 : 1);
      element_kernels(isa()).optimizer_update(p.data(), g.data(), m.data(), nullptr, kCount, scalars);
      for (std::size_t i = 0; i < kCount; ++i) {
        const double grad = double{g[i]} + double{float(sgd.weight_decay)} * p0[i];
        const double buf = (first ? 0.0 : double{float(sgd.momentum)} * m0[i]) + grad;
        // Momentum 0 keeps no buffer, as PyTorch's SGD: it is left as it was.
        ASSERT_NEAR(m[i], momentum == 0.0f ? m0[i] : buf, momentum == 0.0f ? 0.0 : 1e-6) << i;
        ASSERT_NEAR(p[i], p0[i] - double{float(sgd.lr)} * buf, 1e-6) << i;
      }
    }
}

#if defined(__SANITIZE_ADDRESS__)
// Under ASan the kernels that stream whole buffers check each buffer's range once a call
// instead of each element (whole_ranges.hpp): a call that reaches past the end of any one
// of its buffers, the others long enough, still stops the program, naming the bad access.

// Four buffers of count + 1 floats but `short_one`, of count, each ending at its allocation.
std::vector<std::vector<float>> one_short(std::size_t count, int short_one) {
  std::vector<std::vector<float>> buffers(4, std::vector<float>(count + 1, 1.0f));
  buffers[short_one].resize(count);
  buffers[short_one].shrink_to_fit();
  return buffers;
}

TEST_P(Update, AnUpdatePastAnyOfItsBuffersIsCaughtUnderAsan) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr std::size_t kCount = 1003;
  const OptimizerOptions sgd{0.05f, 0.9f, 0.0f}, adam{1e-3, 0.0, 0.0, false, OptimizerKind::kAdam};
  for (int short_one = 0; short_one < 4; ++short_one) {  // params, grads, first, second
    SCOPED_TRACE(short_one);
    const OptimizerOptions& options = short_one == 3 ? adam : sgd;
    const UpdateScalars scalars = update_scalars(options, base_values(options), 1);
    std::vector<std::vector<float>> buffers = one_short(kCount, short_one);
    EXPECT_DEATH(element_kernels(isa()).optimizer_update(buffers[0].data(), buffers[1].data(), buffers[2].data(),
                                                         buffers[3].data(), kCount + 1, scalars),
                 "AddressSanitizer");
  }
}

TEST_P(Norm, ASumOrDotPastItsBuffersIsCaughtUnderAsan) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::vector<float> x(1003, 1.0f), longer(1004, 1.0f);
  double sum = 0;
  EXPECT_DEATH(element_kernels(isa()).sum_of_squares(x.data(), x.size() + 1, &sum), "AddressSanitizer");
  EXPECT_DEATH(dot_in_order_variant(isa())(longer.data(), x.data(), longer.size(), &sum), "AddressSanitizer");
  EXPECT_DEATH(dot_in_order_variant(isa())(x.data(), longer.data(), longer.size(), &sum), "AddressSanitizer");
}

// The in-order sum of ranks' buffers, with one input or one output short.
TEST(ReduceInOrder, ASumPastAnInputOrAnOutputIsCaughtUnderAsan) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr std::size_t kCount = 3000;
  for (int short_one = 0; short_one < 4; ++short_one) {  // inputs 0, 1; outputs 0, 1
    SCOPED_TRACE(short_one);
    std::vector<std::vector<float>> buffers = one_short(kCount, short_one);
    const float* in[] = {buffers[0].data(), buffers[1].data()};
    float* out[] = {buffers[2].data(), buffers[3].data()};
    EXPECT_DEATH(reduce_in_order(in, 0, kCount + 1, out, ReduceOp::kSum, 2), "AddressSanitizer");
  }
}
#endif

// The same bits on every ISA (the ranks of a run must agree on the norm), close to a
// plain sum, and non-finite when one element is.
TEST_P(Norm, SumOfSquaresIsTheSameOnEveryIsaAndSeesANaN) {
  for (std::size_t count : {0u, 1u, 7u, 8u, 9u, 1003u, 100003u}) {
    std::vector<float> x = uniform(count, -3, 3, 4);
    double got = -1, portable = -1;
    element_kernels(isa()).sum_of_squares(x.data(), count, &got);
    element_kernels(Isa::kPortable).sum_of_squares(x.data(), count, &portable);
    double plain = 0;
    for (float v : x) plain += double{v} * v;
    EXPECT_EQ(got, portable) << count;
    EXPECT_NEAR(got, plain, 1e-12 * std::max(1.0, plain)) << count;
    if (count == 0) continue;
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> y = x;
      y[count / 2] = bad;
      element_kernels(isa()).sum_of_squares(y.data(), count, &got);
      EXPECT_FALSE(std::isfinite(got)) << count;
    }
  }
}

// `got` against the float64 sum of term(0) .. term(n - 1): within 1e-7 n times the sum of
// their magnitudes (float rounding at each of n additions).
template <class Term>
::testing::AssertionResult near_float64_sum(float got, std::size_t n, Term term) {
  double exact = 0, bound = 0;
  for (std::size_t k = 0; k < n; ++k) {
    exact += term(k);
    bound += std::abs(term(k));
  }
  if (std::abs(got - exact) <= 1e-7 * static_cast<double>(n) * bound + 1e-30) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << got << " against " << exact << " (sum of magnitudes " << bound << ")";
}

// --exchange factors: rows of fc1's weight gradient G^T X from gathered factors, near a
// float64 product, the same bits in any chunking and on AVX2 and AVX-512 (each element the
// same chain of fused multiply-adds, so ranks on hosts of either agree); its squared norm
// from the factors the same on every ISA, near the product's, and non-finite with a NaN.
TEST_P(Factors, ProductRowsAndNormFromTheFactors) {
  for (std::uint32_t rows : {1u, 3u, 8u, 17u, 70u}) {  // 70: two passes of the kernel's 64-row panels
    const std::vector<float> g = uniform(std::size_t{rows} * kHidden, -1, 1, 5);
    const std::vector<float> x = uniform(std::size_t{rows} * kFlat, 0, 2, 6);
    std::vector<float> whole(std::size_t{kHidden} * kFlat), chunked(whole.size());
    factor_product_rows_variant(isa())(g.data(), x.data(), rows, 0, kHidden, whole.data());
    for (std::size_t first = 0; first < kHidden; first += 8)
      factor_product_rows_variant(isa())(g.data(), x.data(), rows, first, 8, chunked.data() + first * kFlat);
    EXPECT_EQ(whole, chunked) << rows;
    double squares = 0;
    for (std::size_t i = 0; i < kHidden; ++i) {
      for (std::size_t j = 0; j < kFlat; j += 37)  // a sample of the columns against float64
        ASSERT_TRUE(near_float64_sum(whole[i * kFlat + j], rows,
                                     [&](std::size_t r) { return double{g[r * kHidden + i]} * x[r * kFlat + j]; }))
            << rows << " " << i << " " << j;
    }
    for (float v : whole) squares += double{v} * v;
    if (isa() == Isa::kAvx512) {  // AVX-512's bits against AVX2's
      std::vector<float> avx2(whole.size());
      factor_product_rows_variant(Isa::kAvx2)(g.data(), x.data(), rows, 0, kHidden, avx2.data());
      EXPECT_EQ(whole, avx2) << rows;
    }
    double got = factor_product_squares(g.data(), x.data(), rows, isa());
    const double portable = factor_product_squares(g.data(), x.data(), rows, Isa::kPortable);
    EXPECT_EQ(got, portable) << rows;
    EXPECT_NEAR(got, squares, 1e-5 * squares) << rows;
    std::vector<float> bad = x;
    bad[kFlat / 2] = std::numeric_limits<float>::quiet_NaN();
    got = factor_product_squares(g.data(), bad.data(), rows, isa());
    EXPECT_FALSE(std::isfinite(got)) << rows;
  }
}

// fc1's backward passes where they are ours (own_fc1_backward): the weight gradient G^T X
// and the data gradient G W near float64 products, the bias gradient G's column sums in
// row order exactly, at batches with and without a short last block of rows; the same
// bits on AVX2 and AVX-512.
TEST_P(Fc, Fc1BackwardWeightsAndDataNearFloat64) {
  for (std::uint32_t rows : {1u, 3u, 32u, 33u, 70u}) {
    const std::vector<float> g = uniform(std::size_t{rows} * kHidden, -1, 1, 7);
    const std::vector<float> x = uniform(std::size_t{rows} * kFlat, 0, 2, 8);
    const std::vector<float> w = uniform(std::size_t{kHidden} * kFlat, -0.01f, 0.01f, 9);
    std::vector<float> weights(std::size_t{kHidden} * kFlat), bias(kHidden), data(std::size_t{rows} * kFlat);
    std::vector<float> g_t(kHidden * fc1_transposed_stride(rows));
    fc1_backward_weights(g.data(), x.data(), rows, weights.data(), bias.data(), isa());
    fc1_backward_data(g.data(), w.data(), rows, g_t.data(), data.data(), isa());
    for (std::size_t i = 0; i < kHidden; ++i) {
      float sum = g[i];
      for (std::size_t r = 1; r < rows; ++r) sum += g[r * kHidden + i];
      ASSERT_EQ(bias[i], sum) << rows << " " << i;
      for (std::size_t j = 0; j < kFlat; j += 37)
        ASSERT_TRUE(near_float64_sum(weights[i * kFlat + j], rows,
                                     [&](std::size_t r) { return double{g[r * kHidden + i]} * x[r * kFlat + j]; }))
            << "weights, " << rows << " rows, " << i << " " << j;
    }
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < kFlat; j += 13)
        ASSERT_TRUE(near_float64_sum(data[r * kFlat + j], kHidden,
                                     [&](std::size_t o) { return double{g[r * kHidden + o]} * w[o * kFlat + j]; }))
            << "data, " << rows << " rows, " << r << " " << j;
    if (isa() == Isa::kAvx512) {  // AVX-512's bits against AVX2's
      std::vector<float> weights2(weights.size()), bias2(kHidden), data2(data.size());
      fc1_backward_weights(g.data(), x.data(), rows, weights2.data(), bias2.data(), Isa::kAvx2);
      fc1_backward_data(g.data(), w.data(), rows, g_t.data(), data2.data(), Isa::kAvx2);
      EXPECT_EQ(weights, weights2) << rows;
      EXPECT_EQ(data, data2) << rows;
    }
  }
}

// fc1's forward where it is ours (own_fc1_forward): ReLU(bias + W x) near the float64
// product, with PyTorch's ReLU (a negative sum, -inf too, gives 0; a NaN stays NaN, for the
// step's non-finite check to see), at batches with every size of a last group of rows
// (the kernel takes 4 at a time); each row the same bits whatever the batch.
TEST_P(Fc, Fc1ForwardNearFloat64AndTheSameForARowInAnyBatch) {
  const std::vector<float> w = uniform(std::size_t{kHidden} * kFlat, -0.01f, 0.01f, 11);
  const std::vector<float> bias = uniform(kHidden, -0.5f, 0.5f, 12);
  for (std::uint32_t rows : {1u, 2u, 3u, 4u, 6u, 7u, 9u}) {
    const std::vector<float> x = uniform(std::size_t{rows} * kFlat, 0, 2, 13);
    std::vector<float> out(std::size_t{rows} * kHidden), alone(kHidden);
    fc1_forward(x.data(), w.data(), bias.data(), rows, out.data(), isa());
    std::size_t zeros = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t o = 0; o < kHidden; ++o) {
        const auto term = [&](std::size_t k) {
          return k < kFlat ? double{w[o * kFlat + k]} * x[r * kFlat + k] : double{bias[o]};
        };
        double exact = 0, size = 0;
        for (std::size_t k = 0; k <= kFlat; ++k) {
          exact += term(k);
          size += std::abs(term(k));
        }
        const float got = out[r * kHidden + o];
        if (got == 0) {  // a sum at most its rounding above zero
          ASSERT_LE(exact, 1e-7 * kFlat * size) << rows << " " << r << " " << o;
          ++zeros;
        } else {
          ASSERT_TRUE(near_float64_sum(got, kFlat + 1, term)) << rows << " rows, " << r << " " << o;
        }
      }
      fc1_forward(x.data() + r * kFlat, w.data(), bias.data(), 1, alone.data(), isa());
      ASSERT_EQ(0, std::memcmp(alone.data(), out.data() + r * kHidden, sizeof(float) * kHidden)) << rows << " " << r;
    }
    EXPECT_GT(zeros, 0u) << rows;  // the ReLU was exercised
  }
  std::vector<float> x = uniform(kFlat, 0, 2, 14), out(kHidden);
  const std::vector<float> zero(w.size());  // no products: the bias itself, through the ReLU
  fc1_forward(x.data(), zero.data(), bias.data(), 1, out.data(), isa());
  for (std::size_t o = 0; o < kHidden; ++o) ASSERT_EQ(out[o], std::max(bias[o], 0.0f)) << o;
  x[100] = std::numeric_limits<float>::quiet_NaN();
  fc1_forward(x.data(), w.data(), bias.data(), 1, out.data(), isa());
  for (float v : out) ASSERT_TRUE(std::isnan(v));
  x[100] = std::numeric_limits<float>::infinity();  // +inf x w: +inf or -inf by w's sign
  fc1_forward(x.data(), w.data(), bias.data(), 1, out.data(), isa());
  for (std::size_t o = 0; o < kHidden; ++o)
    ASSERT_EQ(out[o], w[o * kFlat + 100] > 0 ? std::numeric_limits<float>::infinity() : 0.0f) << o;
}

std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) { return isa_name(info.param); }
#define ON_EVERY_ISA(Suite)                                                                                 \
  INSTANTIATE_TEST_SUITE_P(Isas, Suite, ::testing::Values(Isa::kPortable, Isa::kAvx2, Isa::kAvx512), \
                           isa_param_name)
ON_EVERY_ISA(Conv1);
ON_EVERY_ISA(Pool);
ON_EVERY_ISA(Conv2);
ON_EVERY_ISA(Activation);
ON_EVERY_ISA(Update);
ON_EVERY_ISA(Norm);
ON_EVERY_ISA(Factors);
ON_EVERY_ISA(Fc);

}  // namespace
}  // namespace mnist_mt::cpu
