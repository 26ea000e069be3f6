// No operation of the CPU replica's step ever runs a reference (unoptimised)
// implementation, at any batch size the trainer uses, and the own kernels run with the
// process's ISA. tests/meson.build runs this at the native ISA and at ONEDNN_MAX_CPU_ISA=AVX2.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu/device.hpp"
#include "cpu/fc.hpp"
#include "cpu/isa.hpp"
#include "cpu/plan.hpp"
#include "cpu/replica.hpp"
#include "cpu/step.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {
namespace {

TEST(CpuPlans, NoOperationRunsAReferenceImplementation) {
  CpuDevice device(0);
  auto replica = make_cpu_replica(device, 256);
  const std::string own = std::string("own:") + isa_name(kernel_isa());
  RecordProperty("kernel_isa", isa_name(kernel_isa()));
  std::cout << "kernel isa: " << isa_name(kernel_isa()) << "\n";
  for (std::uint32_t batch : {1u, 3u, 4u, 64u, 256u}) {
    const std::vector<KernelInfo> ops = replica->kernels(batch);
    ASSERT_FALSE(ops.empty()) << "batch " << batch;
    std::size_t owned = 0;
    for (const KernelInfo& k : ops) {
      if (batch == 1 || batch == 256) std::cout << "batch " << batch << "  " << k.op << ": " << k.impl << "\n";
      if (k.impl.empty() || is_reference(k.impl))
        ADD_FAILURE() << k.op << " at batch " << batch << " runs \"" << k.impl << "\"";
      if (k.impl.starts_with("own:")) {
        ++owned;
        EXPECT_TRUE(k.impl == own || k.impl.starts_with(own + " ")) << k.op << " at batch " << batch << ": " << k.impl;
      }
    }
    EXPECT_GT(owned, 0u) << "batch " << batch;
  }
}

// conv2's forward is never a direct convolution on AVX2 or AVX-512: oneDNN's Winograd
// where oneDNN's convolution_auto takes it (AVX-512 at large batches), else ours
// (conv2_forward.hpp); and oneDNN's on SSE2.
TEST(CpuPlans, Conv2ForwardOursWhereOneDnnWouldRunADirectConvolution) {
  CpuDevice device(0);
  auto replica = make_cpu_replica(device, 64);
  const Isa isa = kernel_isa();
  const std::string own = std::string("own:") + isa_name(isa) + " winograd 2x3";
  for (std::uint32_t batch : {1u, 4u, 8u, 9u, 16u, 64u}) {
    std::string impl;
    for (const KernelInfo& k : replica->kernels(batch))
      if (k.op == std::string_view(kOpNames[kConv2Forward])) impl = k.impl;
    std::cout << "batch " << batch << "  conv2 forward: " << impl << "\n";
    if (isa == Isa::kPortable) {
      EXPECT_FALSE(impl.starts_with("own:")) << batch;
      continue;
    }
    EXPECT_NE(impl.find("wino"), std::string::npos) << "batch " << batch << ": " << impl;
    if (batch <= 8 || isa == Isa::kAvx2) {
      EXPECT_TRUE(impl.starts_with(own)) << "batch " << batch << ": " << impl;
    }
    if (batch == 64 && isa == Isa::kAvx512) {
      EXPECT_FALSE(impl.starts_with("own:")) << impl;
    }
  }
}

// The names oneDNN gives its reference implementations, and not its optimised ones.
TEST(CpuPlans, ReferenceImplementationsAreRecognised) {
  for (const char* impl : {"ref:any", "gemm:ref", "x64:gemm:ref", "ref_int8:any", "jit:avx2 + ref:any"})
    EXPECT_TRUE(is_reference(impl)) << impl;
  for (const char* impl : {"jit:avx2", "x64:gemm:jit", "jit_wino_4x3:avx512_core", "own:avx2", "reorder jit:uni",
                           "brg:prefer_ymm"})
    EXPECT_FALSE(is_reference(impl)) << impl;
}

// The AVX2 registration really runs the AVX2 kernels (where the CPU has them).
TEST(CpuPlans, KernelIsaFollowsOneDnnLimit) {
  const char* limit = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (limit == nullptr) limit = std::getenv("DNNL_MAX_CPU_ISA");
  std::string name = limit == nullptr ? "" : limit;
  for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (name != "AVX2") GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA is not AVX2";
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) GTEST_SKIP() << "this CPU lacks AVX2";
  EXPECT_STREQ(isa_name(kernel_isa()), "avx2");
}

// fc1's operands for `rows` rows, drawn from `seed`: parameters of a small spread, a
// flattened pool of ReLU-like values (about half zeros) and fc1's output gradient.
void fill_fc1_operands(Buffers& buf, std::vector<float>& params, std::uint32_t rows, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> small(-0.02f, 0.02f), unit(-1.0f, 1.0f);
  for (float& v : params) v = small(rng);
  for (std::size_t i = 0; i < rows * kFlat; ++i) buf.flat.get()[i] = unit(rng) > 0 ? unit(rng) + 1 : 0;
  for (std::size_t i = 0; i < rows * kHidden; ++i) buf.d_hidden.get()[i] = 1e-3f * unit(rng);
}

// |a - b| / |b| over n elements (b not all zeros).
double normwise(const float* a, const float* b, std::size_t n) {
  double apart = 0, size = 0;
  for (std::size_t i = 0; i < n; ++i) {
    apart += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    size += double{b[i]} * b[i];
  }
  EXPECT_GT(size, 0);
  return std::sqrt(apart / size);
}

// fc1's backward passes where a plan takes ours (AVX2, batch 32 and up: own_fc1_backward)
// write what oneDNN's inner products write, from the same buffers: the weight and bias
// gradients at fc1's offsets of the flat gradients, the data gradient in d_flat (W read at
// fc1's offset of the parameters). Batches with and without a short last block of rows.
TEST(CpuPlans, Fc1BackwardOursWritesWhatOneDnnWrites) {
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  constexpr std::uint32_t kMax = 64;
  Buffers buf(kMax, false);
  std::vector<float> params(kParamCount), ours(kParamCount), theirs(kParamCount);
  fill_fc1_operands(buf, params, kMax, 12);
  for (std::uint32_t batch : {32u, 33u, 64u}) {
    ASSERT_TRUE(own_fc1_backward(Isa::kAvx2, batch));
    ASSERT_FALSE(own_fc1_backward(Isa::kPortable, batch));
    const auto own = build_plan(engine, batch, Isa::kAvx2, buf, params.data(), ours.data());
    const auto onednn = build_plan(engine, batch, Isa::kPortable, buf, params.data(), theirs.data());
    ASSERT_TRUE(own->own_fc1_backward);
    ASSERT_FALSE(onednn->own_fc1_backward);
    std::vector<float> d_flat_ours(std::size_t{batch} * kFlat), d_flat_theirs(d_flat_ours.size());
    fc1_backward_weights(*own, buf, ours.data(), stream);
    fc1_backward_data(*own, buf, params.data(), stream);
    stream.wait();
    std::memcpy(d_flat_ours.data(), buf.d_flat.get(), d_flat_ours.size() * sizeof(float));
    fc1_backward_weights(*onednn, buf, theirs.data(), stream);
    fc1_backward_data(*onednn, buf, params.data(), stream);
    stream.wait();
    std::memcpy(d_flat_theirs.data(), buf.d_flat.get(), d_flat_theirs.size() * sizeof(float));
    EXPECT_LE(normwise(ours.data() + kParams[4].offset, theirs.data() + kParams[4].offset, kParams[4].count), 1e-6)
        << "fc1.weight at batch " << batch;
    EXPECT_LE(normwise(ours.data() + kParams[5].offset, theirs.data() + kParams[5].offset, kParams[5].count), 1e-6)
        << "fc1.bias at batch " << batch;
    EXPECT_LE(normwise(d_flat_ours.data(), d_flat_theirs.data(), d_flat_ours.size()), 1e-6)
        << "fc1's data gradient at batch " << batch;
  }
}

// fc1's forward where a plan takes ours (AVX2, batches 2 to 4: own_fc1_forward) writes
// what oneDNN's inner product writes into the hidden activations, from the flattened pool
// and fc1's weights and bias at their offsets of the parameters.
TEST(CpuPlans, Fc1ForwardOursWritesWhatOneDnnWrites) {
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  constexpr std::uint32_t kMax = 4;
  Buffers buf(kMax, false);
  std::vector<float> params(kParamCount), grads(kParamCount);
  fill_fc1_operands(buf, params, kMax, 13);
  ASSERT_FALSE(own_fc1_forward(Isa::kAvx2, 1));
  ASSERT_FALSE(own_fc1_forward(Isa::kAvx2, 5));
  for (std::uint32_t batch : {2u, 3u, 4u}) {
    ASSERT_TRUE(own_fc1_forward(Isa::kAvx2, batch));
    ASSERT_FALSE(own_fc1_forward(Isa::kPortable, batch));
    const auto own = build_plan(engine, batch, Isa::kAvx2, buf, params.data(), grads.data());
    const auto onednn = build_plan(engine, batch, Isa::kPortable, buf, params.data(), grads.data());
    ASSERT_TRUE(own->own_fc1_forward);
    ASSERT_FALSE(onednn->own_fc1_forward);
    const std::size_t n = std::size_t{batch} * kHidden;
    std::fill_n(buf.hidden.get(), n, std::numeric_limits<float>::quiet_NaN());
    fc1_forward(*own, buf, params.data(), stream);
    stream.wait();
    const std::vector<float> ours(buf.hidden.get(), buf.hidden.get() + n);
    std::fill_n(buf.hidden.get(), n, -1.0f);
    fc1_forward(*onednn, buf, params.data(), stream);
    stream.wait();
    const std::vector<float> theirs(buf.hidden.get(), buf.hidden.get() + n);
    EXPECT_GT(std::count(theirs.begin(), theirs.end(), 0.0f), 0) << batch;  // the ReLU's zeros
    EXPECT_LE(normwise(ours.data(), theirs.data(), n), 1e-6) << "fc1's forward at batch " << batch;
  }
}

// With bf16 products (Precision::kBf16) fc1's three passes equal float32 arithmetic on
// operands rounded to bfloat16 (nearest even) up to the order of the float32 sums: the
// product of two bf16 values is exact in float32. And they are not float32's passes: the
// rounding moves each result by about 2^-9 of its size.
TEST(CpuPlans, Bf16ProductsReadRoundedOperands) {
  if (!bf16_products()) GTEST_SKIP() << no_bf16_products();
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  constexpr std::uint32_t kBatch = 8;
  Buffers buf(kBatch, true);
  std::vector<float> params(kParamCount), grads(kParamCount);
  fill_fc1_operands(buf, params, kBatch, 5);
  const auto bf16 = [](float f) {  // round to nearest even, as oneDNN's reorder and PyTorch's .bfloat16()
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&f, &u, sizeof u);
    return f;
  };
  // Normwise distance of `got` from the double sums over k of a(i, k) b(j, k), each operand
  // rounded when `rounded`, plus bias(j); also the same of the unrounded float32 results.
  const auto apart = [&](const std::vector<float>& got, std::size_t rows, std::size_t cols, std::size_t depth,
                         const auto& a, const auto& b, const auto& bias, bool relu) {
    std::array<double, 2> distance{};
    for (int rounded = 0; rounded < 2; ++rounded) {
      double diff = 0, size = 0;
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
          double sum = bias(j);
          for (std::size_t k = 0; k < depth; ++k)
            sum += double{rounded ? bf16(a(i, k)) : a(i, k)} * double{rounded ? bf16(b(j, k)) : b(j, k)};
          if (relu) sum = std::max(sum, 0.0);
          diff += (got[i * cols + j] - sum) * (got[i * cols + j] - sum);
          size += sum * sum;
        }
      EXPECT_GT(size, 0);
      distance[static_cast<std::size_t>(rounded)] = std::sqrt(diff / size);
    }
    return distance;  // {from float32's, from the rounded operands'}
  };
  const auto plan = build_plan(engine, kBatch, kernel_isa(), buf, params.data(), grads.data());
  EXPECT_NE(plan->impl[kFc1Forward].find("reorder"), std::string::npos) << plan->impl[kFc1Forward];
  fc1_forward(*plan, buf, params.data(), stream);
  fc1_backward_weights(*plan, buf, grads.data(), stream);
  fc1_backward_data(*plan, buf, params.data(), stream);
  stream.wait();
  const float* x = buf.flat.get();
  const float* w = params.data() + kParams[4].offset;
  const float* g = buf.d_hidden.get();
  const auto copy = [](const float* p, std::size_t n) { return std::vector<float>(p, p + n); };
  const auto none = [](std::size_t) { return 0.0; };
  const auto forward = apart(copy(buf.hidden.get(), kBatch * kHidden), kBatch, kHidden, kFlat,
                             [&](std::size_t i, std::size_t k) { return x[i * kFlat + k]; },
                             [&](std::size_t j, std::size_t k) { return w[j * kFlat + k]; },
                             [&](std::size_t j) { return double{params[kParams[5].offset + j]}; }, true);
  const auto weights = apart(copy(grads.data() + kParams[4].offset, kParams[4].count), kHidden, kFlat, kBatch,
                             [&](std::size_t i, std::size_t k) { return g[k * kHidden + i]; },
                             [&](std::size_t j, std::size_t k) { return x[k * kFlat + j]; }, none, false);
  const auto bias = apart(copy(grads.data() + kParams[5].offset, kHidden), 1, kHidden, kBatch,
                          [](std::size_t, std::size_t) { return 1.0f; },
                          [&](std::size_t j, std::size_t k) { return g[k * kHidden + j]; }, none, false);
  const auto data = apart(copy(buf.d_flat.get(), kBatch * kFlat), kBatch, kFlat, kHidden,
                          [&](std::size_t i, std::size_t k) { return g[i * kHidden + k]; },
                          [&](std::size_t j, std::size_t k) { return w[k * kFlat + j]; }, none, false);
  for (const auto& [name, d] : {std::pair{"forward", forward}, std::pair{"weight gradient", weights},
                                std::pair{"bias gradient", bias}, std::pair{"data gradient", data}}) {
    EXPECT_LE(d[1], 1e-6) << "fc1 " << name << ": from the rounded operands' products";
    EXPECT_GE(d[0], 1e-4) << "fc1 " << name << ": as near float32's as bf16 products never are";
  }
}

// oneDNN's own message says what failed, not which of the step's operations: the error
// a plan throws names it.
TEST(CpuPlans, AOneDnnFailureWhilePlanningNamesTheOperation) {
  using dnnl::memory;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const memory::desc src({4, 9216}, memory::data_type::f32, memory::format_tag::nc);
  const memory::desc weights({128, 100}, memory::data_type::f32, memory::format_tag::oi);  // 100 != 9216
  const memory::desc dst({4, 128}, memory::data_type::f32, memory::format_tag::nc);
  try {
    planned(kFc1Forward, [&] {
      return dnnl::inner_product_forward::primitive_desc(
          dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, src, weights, dst), engine);
    });
    ADD_FAILURE() << "oneDNN accepted mismatched shapes";
  } catch (const RuntimeFailure& e) {
    EXPECT_EQ(std::string(e.what()).rfind(std::string("oneDNN: ") + kOpNames[kFc1Forward] + ": ", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace mnist_mt::cpu
