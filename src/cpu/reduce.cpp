// The in-order reduction behind the in-process collectives (Device::reduce).
#include "kernels.hpp"

#include <algorithm>

#include "whole_ranges.hpp"

namespace mnist_mt::cpu {
double reduce_in_order(std::span<const float* const> in, std::size_t begin, std::size_t count,
                       std::span<float* const> out, ReduceOp op, std::size_t divisor) {
  for (const float* x : in) whole_ranges::reads(x + begin, count);
  for (float* o : out) whole_ranges::writes(o + begin, count);
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
