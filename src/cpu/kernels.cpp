#include "kernels.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

#include "isa.hpp"
#include "mnist_mt/model.hpp"
#include "simd.hpp"

// The hot loops below are always-inlined bodies compiled once per instruction set
// (simd.hpp); the update and dropout loops are left to GCC's vectoriser. The free functions
// call the variants for kernel_isa(), picked on first use.

namespace mnist_mt::cpu {
namespace {

// Philox over kLanes consecutive counters at once, as GCC vectors (one AVX-512 register).
constexpr int kLanes = 16;
using U32x = std::uint32_t __attribute__((vector_size(4 * kLanes)));
using U64x = std::uint64_t __attribute__((vector_size(8 * kLanes)));
using F32x = float __attribute__((vector_size(4 * kLanes)));

[[gnu::always_inline]] inline void mul_hi_lo(const U32x& a, std::uint32_t m, U32x& hi, U32x& lo) {
  const U64x product = __builtin_convertvector(a, U64x) * std::uint64_t{m};
  hi = __builtin_convertvector(product >> 32, U32x);
  lo = __builtin_convertvector(product, U32x);
}

// Multiplies x[0..63] by the dropout factors (scale or 0) of the 16 counters' words
// c0..c3; element 4*lane + word takes word `word` of counter `lane`. The interleave is two
// rounds of two-register shuffles.
[[gnu::always_inline]] inline void apply_factors(const U32x& c0, const U32x& c1, const U32x& c2, const U32x& c3,
                                                 std::uint32_t threshold, float scale, float* x) {
  const U32x bits = U32x{} + std::bit_cast<std::uint32_t>(scale);
  const F32x f0 = reinterpret_cast<F32x>(reinterpret_cast<U32x>((c0 >> 8) >= threshold) & bits);
  const F32x f1 = reinterpret_cast<F32x>(reinterpret_cast<U32x>((c1 >> 8) >= threshold) & bits);
  const F32x f2 = reinterpret_cast<F32x>(reinterpret_cast<U32x>((c2 >> 8) >= threshold) & bits);
  const F32x f3 = reinterpret_cast<F32x>(reinterpret_cast<U32x>((c3 >> 8) >= threshold) & bits);
  const F32x a_lo = __builtin_shufflevector(f0, f1, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const F32x a_hi = __builtin_shufflevector(f0, f1, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const F32x b_lo = __builtin_shufflevector(f2, f3, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const F32x b_hi = __builtin_shufflevector(f2, f3, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const F32x out[4] = {
      __builtin_shufflevector(a_lo, b_lo, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23),
      __builtin_shufflevector(a_lo, b_lo, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31),
      __builtin_shufflevector(a_hi, b_hi, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23),
      __builtin_shufflevector(a_hi, b_hi, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31)};
  for (int j = 0; j < 4; ++j) {
    F32x v;
    __builtin_memcpy(&v, x + kLanes * j, sizeof v);
    v *= out[j];
    __builtin_memcpy(x + kLanes * j, &v, sizeof v);
  }
}

// uniform01(bits) >= p exactly when (bits >> 8) >= ceil(p * 2^24): both sides are exact.
std::uint32_t keep_threshold(float p) { return static_cast<std::uint32_t>(std::ceil(double{p} * 16777216.0)); }

const std::array<float, 256>& normalise_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) t[v] = (static_cast<float>(v) / 255.0f - kInputMean) / kInputStd;
    return t;
  }();
  return table;
}

template <std::size_t>  // the vector width is GCC's to choose here
[[gnu::always_inline]] inline void dropout_body(const DropoutKey& key, const std::uint32_t* samples,
                                                std::uint32_t batch, RandomStream stream, std::uint32_t elements,
                                                float p, float* x) {
  const std::uint32_t threshold = keep_threshold(p);
  const float scale = 1.0f / (1.0f - p);
  U32x lane{};
  for (int l = 0; l < kLanes; ++l) lane[l] = static_cast<std::uint32_t>(l);
  const auto k0_init = static_cast<std::uint32_t>(key.seed), k1_init = static_cast<std::uint32_t>(key.seed >> 32);
  for (std::uint32_t n = 0; n < batch; ++n) {
    float* row = x + std::size_t{n} * elements;
    for (std::uint32_t base = 0; base < elements; base += 4 * kLanes) {
      // Counter {element/4, sample, stream, epoch}, as dropout_keep() in philox.hpp.
      U32x c0 = lane + base / 4, c1 = U32x{} + samples[n];
      U32x c2 = U32x{} + static_cast<std::uint32_t>(stream), c3 = U32x{} + key.epoch;
      std::uint32_t k0 = k0_init, k1 = k1_init;
      for (int round = 0; round < 10; ++round) {
        U32x hi0, lo0, hi1, lo1;
        mul_hi_lo(c0, 0xD2511F53u, hi0, lo0);
        mul_hi_lo(c2, 0xCD9E8D57u, hi1, lo1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      if (elements - base >= 4 * kLanes) {
        apply_factors(c0, c1, c2, c3, threshold, scale, row + base);
      } else {  // a short last block, through a full-size copy
        float tail[4 * kLanes] = {};
        std::copy(row + base, row + elements, tail);
        apply_factors(c0, c1, c2, c3, threshold, scale, tail);
        std::copy(tail, tail + (elements - base), row + base);
      }
    }
  }
}

template <std::size_t B>
[[gnu::always_inline]] inline void relu_dropout_backward_body(const float* out, float scale, std::size_t count,
                                                              float* d) {
  std::size_t i = 0;
  for (; i + B <= count; i += B) store<B>(d + i, load<B>(out + i) > 0 ? load<B>(d + i) * scale : Vec<B>{});
  for (; i < count; ++i) d[i] = out[i] > 0.0f ? d[i] * scale : 0.0f;
}

// One update of the optimizer over the flat buffers (optimizer.hpp's element functions).
// The scalars are copied first: stores to the float buffers could otherwise alias them,
// which keeps GCC from hoisting their tests out of the loops and vectorising.
template <std::size_t>  // auto-vectorised
[[gnu::always_inline]] inline void update_body(float* params, const float* grads, float* first, float* second,
                                               std::size_t count, const UpdateScalars& scalars) {
  const UpdateScalars s = scalars;
  switch (s.kind) {
    case OptimizerKind::kSgd:
      for (std::size_t i = 0; i < count; ++i) sgd_at(params, grads, first, i, s);
      return;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      for (std::size_t i = 0; i < count; ++i) adam_at(params, grads, first, second, i, s);
      return;
    case OptimizerKind::kAdadelta:
      for (std::size_t i = 0; i < count; ++i) adadelta_at(params, grads, first, second, i, s);
      return;
  }
}

// 32 lanes, summed in lane order at the end: the same bits on every ISA. A float's
// square is exact in double, so a fused multiply-add rounds as a multiply and an add do.
// Several vectors of doubles (four of eight on AVX-512, eight of four on AVX2), so that
// the adds do not wait on each other's latency.
template <std::size_t>  // auto-vectorised
[[gnu::always_inline]] inline void sum_of_squares_body(const float* x, std::size_t count, double* out) {
  constexpr std::size_t kLanes = 32;
  double lanes[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (std::size_t j = 0; j < kLanes; ++j) lanes[j] += double{x[i + j]} * double{x[i + j]};
  }
  for (std::size_t j = 0; i + j < count; ++j) lanes[j] += double{x[i + j]} * double{x[i + j]};
  double sum = 0;
  for (double lane : lanes) sum += lane;
  *out = sum;
}

MNIST_MT_ISA_VARIANTS(dropout, dropout_body,
                      (const DropoutKey& key, const std::uint32_t* samples, std::uint32_t batch,
                       RandomStream stream, std::uint32_t elements, float p, float* x),
                      (key, samples, batch, stream, elements, p, x))
MNIST_MT_ISA_VARIANTS(relu_dropout_backward, relu_dropout_backward_body,
                      (const float* out, float scale, std::size_t count, float* d), (out, scale, count, d))
MNIST_MT_ISA_VARIANTS(update, update_body,
                      (float* params, const float* grads, float* first, float* second, std::size_t count,
                       const UpdateScalars& scalars),
                      (params, grads, first, second, count, scalars))
MNIST_MT_ISA_VARIANTS(sum_of_squares, sum_of_squares_body, (const float* x, std::size_t count, double* out),
                      (x, count, out))

}  // namespace

void normalise_images(const std::uint8_t* pixels, std::size_t count, float* out) {
  const std::array<float, 256>& table = normalise_table();
  for (std::size_t i = 0; i < count; ++i) out[i] = table[pixels[i]];
}

ElementKernels element_kernels(Isa isa) {
  return pick<ElementKernels>(isa, {dropout_avx512, relu_dropout_backward_avx512, update_avx512, sum_of_squares_avx512},
                              {dropout_avx2, relu_dropout_backward_avx2, update_avx2, sum_of_squares_avx2},
                              {dropout_portable, relu_dropout_backward_portable, update_portable, sum_of_squares_portable});
}

namespace {
const ElementKernels& process_kernels() {
  static const ElementKernels kernels = element_kernels(kernel_isa());
  return kernels;
}
}  // namespace

void dropout_forward(const DropoutKey& key, const std::uint32_t* samples, std::uint32_t batch, RandomStream stream,
                     std::uint32_t elements, float p, float* x) {
  process_kernels().dropout_forward(key, samples, batch, stream, elements, p, x);
}

void relu_dropout_backward(const float* out, float scale, std::size_t count, float* d) {
  process_kernels().relu_dropout_backward(out, scale, count, d);
}

void log_softmax_nll(const float* logits, const std::uint8_t* labels, std::uint32_t batch, float denominator,
                     float* logp, float* dlogits, LossSums& sums) {
  for (std::uint32_t n = 0; n < batch; ++n) {
    const float* x = logits + n * kClasses;
    std::uint32_t best = 0;
    for (std::uint32_t k = 1; k < kClasses; ++k)
      if (x[k] > x[best]) best = k;
    double sum = 0;
    for (std::uint32_t k = 0; k < kClasses; ++k) sum += std::exp(double{x[k]} - double{x[best]});
    const double lse = double{x[best]} + std::log(sum);
    float* lp = logp + n * kClasses;
    float* d = dlogits + n * kClasses;
    for (std::uint32_t k = 0; k < kClasses; ++k) {
      lp[k] = static_cast<float>(double{x[k]} - lse);
      d[k] = (std::exp(lp[k]) - (k == labels[n] ? 1.0f : 0.0f)) / denominator;
    }
    sums.loss -= lp[labels[n]];
    sums.correct += best == labels[n] ? 1 : 0;
  }
}

void optimizer_update(float* params, const float* grads, float* first, float* second, std::size_t count,
                      const UpdateScalars& scalars) {
  process_kernels().optimizer_update(params, grads, first, second, count, scalars);
}

double sum_of_squares(const float* x, std::size_t count) {
  double sum = 0;
  process_kernels().sum_of_squares(x, count, &sum);
  return sum;
}

double reduce_in_order(std::span<const float* const> in, std::size_t begin, std::size_t count,
                       std::span<float* const> out, ReduceOp op, std::size_t divisor) {
  // The block keeps the loop vectorised and lets `out` alias an input; the squares are
  // summed block by block while the block is in cache.
  constexpr std::size_t kBlock = 1024;
  alignas(64) float acc[kBlock];
  const bool exact_inverse = (divisor & (divisor - 1)) == 0;
  const float inverse = 1.0f / static_cast<float>(divisor), by = static_cast<float>(divisor);
  double squares = 0;
  for (std::size_t b = begin; b < begin + count; b += kBlock) {
    const std::size_t n = std::min(kBlock, begin + count - b);
    std::copy_n(in[0] + b, n, acc);
    for (std::size_t s = 1; s < in.size(); ++s) {
      const float* x = in[s] + b;
      for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
    }
    if (op == ReduceOp::kAverage && exact_inverse) {
      for (std::size_t i = 0; i < n; ++i) acc[i] *= inverse;
    } else if (op == ReduceOp::kAverage) {
      for (std::size_t i = 0; i < n; ++i) acc[i] /= by;
    }
    squares += sum_of_squares(acc, n);
    for (float* o : out) std::copy_n(acc, n, o + b);
  }
  return squares;
}

}  // namespace mnist_mt::cpu
