// The sum of squares of the gradients (their norm), per instruction set (simd.hpp), in the
// same order of additions on each.
#include "kernels.hpp"

#include "simd.hpp"
#include "whole_ranges.hpp"

namespace mnist_mt::cpu {
namespace {

// a . b over 32 lanes, summed in lane order at the end: the same bits on every ISA. A
// product of floats is exact in double, so a fused multiply-add rounds as a multiply and an
// add do. Several vectors of doubles (four of eight on AVX-512, eight of four on AVX2), so
// that the adds do not wait on each other's latency.
template <std::size_t>  // auto-vectorised
[[gnu::always_inline]] inline void dot_body(const float* a, const float* b, std::size_t count, double* out) {
  whole_ranges::reads(a, count);
  whole_ranges::reads(b, count);
  whole_ranges::writes(out, 1);
  constexpr std::size_t kLanes = 32;
  double lanes[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (std::size_t j = 0; j < kLanes; ++j) lanes[j] += double{a[i + j]} * double{b[i + j]};
  }
  for (std::size_t j = 0; i + j < count; ++j) lanes[j] += double{a[i + j]} * double{b[i + j]};
  double sum = 0;
  for (double lane : lanes) sum += lane;
  *out = sum;
}

template <std::size_t B>
[[gnu::always_inline]] inline void sum_of_squares_body(const float* x, std::size_t count, double* out) {
  dot_body<B>(x, x, count, out);
}

MNIST_MT_ISA_VARIANTS(sum_of_squares, sum_of_squares_body, (const float* x, std::size_t count, double* out),
                      (x, count, out))
MNIST_MT_ISA_VARIANTS(dot, dot_body, (const float* a, const float* b, std::size_t count, double* out),
                      (a, b, count, out))

}  // namespace

DotFn dot_in_order_variant(Isa isa) { return pick<DotFn>(isa, dot_avx512, dot_avx2, dot_portable); }

SumOfSquaresFn sum_of_squares_variant(Isa isa) {
  return pick<SumOfSquaresFn>(isa, sum_of_squares_avx512, sum_of_squares_avx2, sum_of_squares_portable);
}

}  // namespace mnist_mt::cpu
