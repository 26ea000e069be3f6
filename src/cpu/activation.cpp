// Dropout after max-pool and fc1 (Philox masks, docs/architecture.md decision 9), and the
// backward of ReLU with dropout: vector bodies compiled once per instruction set (simd.hpp).
#include "kernels.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

#include "simd.hpp"

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

MNIST_MT_ISA_VARIANTS(dropout, dropout_body,
                      (const DropoutKey& key, const std::uint32_t* samples, std::uint32_t batch,
                       RandomStream stream, std::uint32_t elements, float p, float* x),
                      (key, samples, batch, stream, elements, p, x))
MNIST_MT_ISA_VARIANTS(relu_dropout_backward, relu_dropout_backward_body,
                      (const float* out, float scale, std::size_t count, float* d), (out, scale, count, d))
}  // namespace

DropoutForwardFn dropout_forward_variant(Isa isa) {
  return pick<DropoutForwardFn>(isa, dropout_avx512, dropout_avx2, dropout_portable);
}

ReluDropoutBackwardFn relu_dropout_backward_variant(Isa isa) {
  return pick<ReluDropoutBackwardFn>(isa, relu_dropout_backward_avx512, relu_dropout_backward_avx2,
                                     relu_dropout_backward_portable);
}

}  // namespace mnist_mt::cpu
