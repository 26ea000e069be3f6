// fc1's forward of a small batch (own_fc1_forward in fc.hpp), per instruction set
// (simd.hpp): at a few rows the product is a stream of fc1's 4.7 MB of weights past the
// rows held in cache, which oneDNN's inner product runs well below that stream's pace on
// AVX2.
#include "kernels.hpp"
#include "mnist_mt/model.hpp"
#include "simd.hpp"

namespace mnist_mt::cpu {
namespace {

// Output rows of a block: their accumulators, kN per row, and the rows' vectors stay in
// registers (4 x 4 + 4 + 1 of AVX-512's 32, 2 x 4 + 4 + 1 of AVX2's 16).
template <std::size_t B>
constexpr std::size_t kRowsOfW = B == 16 ? 4 : 2;
constexpr std::uint32_t kMostRows = 4;  // rows of x a pass over the weights takes

// out[n][o] = ReLU(bias[o] + x[n] . w[o]) for the kN rows of x at `x` (kFlat floats
// apart) and every output o (w: kHidden rows of kFlat, oi), out's rows kHidden apart. Each
// dot product is B partial sums over k in order (fused multiply-adds where the ISA has
// them), then its lanes in order: the same bits for a row whatever the batch.
template <std::size_t B, std::uint32_t kN>
[[gnu::always_inline]] inline void forward_rows(const float* x, const float* w, const float* bias, float* out) {
  constexpr std::size_t kO = kRowsOfW<B>;
  static_assert(kFlat % B == 0 && kHidden % kO == 0);
  for (std::size_t o0 = 0; o0 < kHidden; o0 += kO) {
    Vec<B> acc[kO][kN] = {};
    const float* wo = w + o0 * kFlat;
    for (std::size_t k = 0; k < kFlat; k += B) {
      Vec<B> xv[kN];
#pragma GCC unroll 4
      for (std::uint32_t n = 0; n < kN; ++n) xv[n] = load<B>(x + n * kFlat + k);
#pragma GCC unroll 4
      for (std::size_t o = 0; o < kO; ++o) {
        const Vec<B> wv = load<B>(wo + o * kFlat + k);
#pragma GCC unroll 4
        for (std::uint32_t n = 0; n < kN; ++n) acc[o][n] += wv * xv[n];
      }
    }
    for (std::size_t o = 0; o < kO; ++o)
      for (std::uint32_t n = 0; n < kN; ++n) {
        float sum = acc[o][n][0];
        for (std::size_t l = 1; l < B; ++l) sum += acc[o][n][l];
        const float y = sum + bias[o0 + o];
        out[n * kHidden + o0 + o] = y < 0 ? 0.0f : y;  // PyTorch's ReLU (conv1's): a NaN stays NaN
      }
  }
}

template <std::size_t B>
[[gnu::always_inline]] inline void forward(const float* x, const float* w, const float* bias, std::uint32_t rows,
                                           float* out) {
  for (std::uint32_t n = 0; n < rows; n += kMostRows) {
    const float* xn = x + std::size_t{n} * kFlat;
    float* on = out + std::size_t{n} * kHidden;
    switch (rows - n < kMostRows ? rows - n : kMostRows) {
      case 1: forward_rows<B, 1>(xn, w, bias, on); break;
      case 2: forward_rows<B, 2>(xn, w, bias, on); break;
      case 3: forward_rows<B, 3>(xn, w, bias, on); break;
      default: forward_rows<B, 4>(xn, w, bias, on); break;
    }
  }
}
MNIST_MT_ISA_VARIANTS(forward, forward,
                      (const float* x, const float* w, const float* bias, std::uint32_t rows, float* out),
                      (x, w, bias, rows, out))
using ForwardFn = void (*)(const float*, const float*, const float*, std::uint32_t, float*);

}  // namespace

void fc1_forward(const float* x, const float* w, const float* bias, std::uint32_t rows, float* out, Isa isa) {
  pick<ForwardFn>(isa, forward_avx512, forward_avx2, forward_portable)(x, w, bias, rows, out);
}

}  // namespace mnist_mt::cpu
