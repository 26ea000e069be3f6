// Dropout after max-pool and fc1 (Philox masks, docs/architecture.md decision 9), and the
// backward of ReLU with dropout: vector bodies compiled once per instruction set (simd.hpp).
#include "kernels.hpp"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "simd.hpp"

namespace mnist_mt::cpu {
namespace {

// Philox over kLanes consecutive counters at once, as GCC vectors: the portable variant.
// The AVX2 and AVX-512 variants (below) are written with intrinsics.
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

// The AVX2 variant: AVX2 has no 64-bit lane multiply, and GCC lowers the vector code
// above (16 lanes of 64-bit products) to slow sequences there. Here each
// 32x32->64 product is _mm256_mul_epu32 on the even lanes and on the odd lanes shifted
// down; the high and low halves are blended back into place. Two groups of 8 counters
// (64 elements) per block keep two independent chains of rounds in flight. The masks and
// the rounding are those of dropout_body, bit for bit (test_cpu_kernels, every ISA).
namespace avx2 {

constexpr int kGroups = 2;
constexpr std::uint32_t kBlock = 32 * kGroups;  // elements per block

MNIST_MT_AVX2 [[gnu::always_inline]] inline void mul_hi_lo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);                          // lanes 0, 2, 4, 6
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1, 3, 5, 7
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// x[0..31] times the factors of 8 counters' words c0..c3: element 4*lane + word takes
// word `word` of counter `lane` (a 4x8 transpose).
MNIST_MT_AVX2 [[gnu::always_inline]] inline void apply_factors(const __m256i (&c)[4], __m256i below, __m256i bits,
                                                               float* x) {
  __m256i f[4];
  for (int w = 0; w < 4; ++w) f[w] = _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_srli_epi32(c[w], 8), below), bits);
  const __m256i t0 = _mm256_unpacklo_epi32(f[0], f[1]), t1 = _mm256_unpackhi_epi32(f[0], f[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(f[2], f[3]), t3 = _mm256_unpackhi_epi32(f[2], f[3]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);  // counters 0|4, 1|5
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);  // counters 2|6, 3|7
  const __m256i out[4] = {_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u2, u3, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31), _mm256_permute2x128_si256(u2, u3, 0x31)};
  for (int j = 0; j < 4; ++j)
    _mm256_storeu_ps(x + 8 * j, _mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), _mm256_castsi256_ps(out[j])));
}

MNIST_MT_AVX2 void dropout(const DropoutKey& key, const std::uint32_t* samples, std::uint32_t batch,
                           RandomStream stream, std::uint32_t elements, float p, float* x) {
  // (bits >> 8) >= threshold as a signed compare: both sides are below 2^24 + 1.
  const __m256i below = _mm256_set1_epi32(static_cast<int>(keep_threshold(p)) - 1);
  const __m256i bits = _mm256_set1_epi32(static_cast<int>(std::bit_cast<std::uint32_t>(1.0f / (1.0f - p))));
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u)), m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const auto k0_init = static_cast<std::uint32_t>(key.seed), k1_init = static_cast<std::uint32_t>(key.seed >> 32);
  for (std::uint32_t n = 0; n < batch; ++n) {
    float* row = x + std::size_t{n} * elements;
    const __m256i sample = _mm256_set1_epi32(static_cast<int>(samples[n]));
    const __m256i word2 = _mm256_set1_epi32(static_cast<int>(stream)), word3 = _mm256_set1_epi32(static_cast<int>(key.epoch));
    for (std::uint32_t base = 0; base < elements; base += kBlock) {
      // Counter {element/4, sample, stream, epoch}, as dropout_keep() in philox.hpp.
      __m256i c[kGroups][4];
      for (int g = 0; g < kGroups; ++g)
        c[g][0] = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(base / 4 + 8 * g))), c[g][1] = sample,
        c[g][2] = word2, c[g][3] = word3;
      std::uint32_t k0 = k0_init, k1 = k1_init;
      for (int round = 0; round < 10; ++round) {
        const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0)), key1 = _mm256_set1_epi32(static_cast<int>(k1));
        for (int g = 0; g < kGroups; ++g) {
          __m256i hi0, lo0, hi1, lo1;
          mul_hi_lo(c[g][0], m0, hi0, lo0);
          mul_hi_lo(c[g][2], m1, hi1, lo1);
          c[g][0] = _mm256_xor_si256(_mm256_xor_si256(hi1, c[g][1]), key0);
          c[g][1] = lo1;
          c[g][2] = _mm256_xor_si256(_mm256_xor_si256(hi0, c[g][3]), key1);
          c[g][3] = lo0;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      if (elements - base >= kBlock) {
        for (int g = 0; g < kGroups; ++g) apply_factors(c[g], below, bits, row + base + 32 * g);
      } else {  // a short last block, through a full-size copy
        float tail[kBlock] = {};
        std::copy(row + base, row + elements, tail);
        for (int g = 0; g < kGroups; ++g) apply_factors(c[g], below, bits, tail + 32 * g);
        std::copy(tail, tail + (elements - base), row + base);
      }
    }
  }
}

}  // namespace avx2

// The same scheme on AVX-512 registers, 16 counters each: _mm512_mul_epu32 rather than the
// 64-bit lane multiply (vpmullq) that GCC makes of the vector code.
// GCC 12 warns of its own _mm512_undefined_epi32() inside the unmasked intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace avx512 {

constexpr int kGroups = 2;
constexpr std::uint32_t kBlock = 64 * kGroups;  // elements per block

MNIST_MT_AVX512 [[gnu::always_inline]] inline void mul_hi_lo(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

// x[0..63] times the factors of 16 counters' words: the 4x4 transposes within each
// 128-bit lane, then a 4x4 transpose of the lanes.
MNIST_MT_AVX512 [[gnu::always_inline]] inline void apply_factors(const __m512i (&c)[4], __m512i below, __m512i bits,
                                                                 float* x) {
  __m512i f[4];
  for (int w = 0; w < 4; ++w)
    f[w] = _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(_mm512_srli_epi32(c[w], 8), below), bits);
  const __m512i t0 = _mm512_unpacklo_epi32(f[0], f[1]), t1 = _mm512_unpackhi_epi32(f[0], f[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(f[2], f[3]), t3 = _mm512_unpackhi_epi32(f[2], f[3]);
  // u_k, lane l: counter 4l + k.
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
  const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
  const __m512i p0 = _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(1, 0, 1, 0));  // u0.0 u0.1 u1.0 u1.1
  const __m512i p1 = _mm512_shuffle_i32x4(u2, u3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i p2 = _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i p3 = _mm512_shuffle_i32x4(u2, u3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i out[4] = {_mm512_shuffle_i32x4(p0, p1, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(p0, p1, _MM_SHUFFLE(3, 1, 3, 1)),
                          _mm512_shuffle_i32x4(p2, p3, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(p2, p3, _MM_SHUFFLE(3, 1, 3, 1))};
  for (int j = 0; j < 4; ++j)
    _mm512_storeu_ps(x + 16 * j, _mm512_mul_ps(_mm512_loadu_ps(x + 16 * j), _mm512_castsi512_ps(out[j])));
}

MNIST_MT_AVX512 void dropout(const DropoutKey& key, const std::uint32_t* samples, std::uint32_t batch,
                             RandomStream stream, std::uint32_t elements, float p, float* x) {
  const __m512i below = _mm512_set1_epi32(static_cast<int>(keep_threshold(p)) - 1);
  const __m512i bits = _mm512_set1_epi32(static_cast<int>(std::bit_cast<std::uint32_t>(1.0f / (1.0f - p))));
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u)), m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const auto k0_init = static_cast<std::uint32_t>(key.seed), k1_init = static_cast<std::uint32_t>(key.seed >> 32);
  for (std::uint32_t n = 0; n < batch; ++n) {
    float* row = x + std::size_t{n} * elements;
    const __m512i sample = _mm512_set1_epi32(static_cast<int>(samples[n]));
    const __m512i word2 = _mm512_set1_epi32(static_cast<int>(stream)), word3 = _mm512_set1_epi32(static_cast<int>(key.epoch));
    for (std::uint32_t base = 0; base < elements; base += kBlock) {
      __m512i c[kGroups][4];
      for (int g = 0; g < kGroups; ++g)
        c[g][0] = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(base / 4 + 16 * g))), c[g][1] = sample,
        c[g][2] = word2, c[g][3] = word3;
      std::uint32_t k0 = k0_init, k1 = k1_init;
      for (int round = 0; round < 10; ++round) {
        const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0)), key1 = _mm512_set1_epi32(static_cast<int>(k1));
        for (int g = 0; g < kGroups; ++g) {
          __m512i hi0, lo0, hi1, lo1;
          mul_hi_lo(c[g][0], m0, hi0, lo0);
          mul_hi_lo(c[g][2], m1, hi1, lo1);
          c[g][0] = _mm512_xor_si512(_mm512_xor_si512(hi1, c[g][1]), key0);
          c[g][1] = lo1;
          c[g][2] = _mm512_xor_si512(_mm512_xor_si512(hi0, c[g][3]), key1);
          c[g][3] = lo0;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      if (elements - base >= kBlock) {
        for (int g = 0; g < kGroups; ++g) apply_factors(c[g], below, bits, row + base + 64 * g);
      } else {
        float tail[kBlock] = {};
        std::copy(row + base, row + elements, tail);
        for (int g = 0; g < kGroups; ++g) apply_factors(c[g], below, bits, tail + 64 * g);
        std::copy(tail, tail + (elements - base), row + base);
      }
    }
  }
}

}  // namespace avx512
#pragma GCC diagnostic pop

template <std::size_t B>
[[gnu::always_inline]] inline void relu_dropout_backward_body(const float* out, float scale, std::size_t count,
                                                              float* d) {
  std::size_t i = 0;
  for (; i + B <= count; i += B) store<B>(d + i, load<B>(out + i) > 0 ? load<B>(d + i) * scale : Vec<B>{});
  for (; i < count; ++i) d[i] = out[i] > 0.0f ? d[i] * scale : 0.0f;
}

// Dropout's AVX-512 and AVX2 variants are avx512::dropout and avx2::dropout above.
void dropout_portable(const DropoutKey& key, const std::uint32_t* samples, std::uint32_t batch, RandomStream stream,
                      std::uint32_t elements, float p, float* x) {
  dropout_body<8>(key, samples, batch, stream, elements, p, x);
}
MNIST_MT_ISA_VARIANTS(relu_dropout_backward, relu_dropout_backward_body,
                      (const float* out, float scale, std::size_t count, float* d), (out, scale, count, d))
}  // namespace

DropoutForwardFn dropout_forward_variant(Isa isa) {
  return pick<DropoutForwardFn>(isa, avx512::dropout, avx2::dropout, dropout_portable);
}

ReluDropoutBackwardFn relu_dropout_backward_variant(Isa isa) {
  return pick<ReluDropoutBackwardFn>(isa, relu_dropout_backward_avx512, relu_dropout_backward_avx2,
                                     relu_dropout_backward_portable);
}

}  // namespace mnist_mt::cpu
