#pragma once
// Inputs, the comparison and the nChw{B}c index shared by the tests of the CUDA kernels' references
// (test_cuda_reference.cpp), of the CUDA kernels (test_cuda_kernels.cpp) and of the CPU
// kernels (test_cpu_kernels.cpp).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace mnist_mt::testing_inputs {

// Equal values, NaN equal to NaN; +0 and -0 count as equal (the sign of a zero gradient or
// ReLU output reaches no result).
inline bool same(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

inline std::vector<float> uniform(std::size_t count, float lo, float hi, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& e : v) e = dist(rng);
  return v;
}

// Values on a coarse grid in [-2, 2], so 2x2 windows and logits often tie exactly.
inline std::vector<float> grid_values(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> level(-8, 8);
  std::vector<float> v(count);
  for (float& e : v) e = 0.25f * static_cast<float>(level(rng));
  return v;
}

// Every stride-th value, from the offset, made NaN.
inline void sprinkle_nan(std::vector<float>& v, std::size_t stride, std::size_t offset) {
  for (std::size_t i = offset; i < v.size(); i += stride) v[i] = std::nanf("");
}

// Element (n, c, y, x) of a batch x C x side x side map in the nChw{B}c layout.
inline std::size_t blocked(std::size_t n, std::size_t c, std::size_t y, std::size_t x, std::size_t channels,
                           std::size_t side, std::size_t block) {
  return ((n * (channels / block) + c / block) * side * side + y * side + x) * block + c % block;
}
// The same for element i of the map in NCHW order.
inline std::size_t blocked(std::size_t i, std::size_t channels, std::size_t side, std::size_t block) {
  const std::size_t plane = side * side, at = i % plane;
  return blocked(i / (channels * plane), i / plane % channels, at / side, at % side, channels, side, block);
}

}  // namespace mnist_mt::testing_inputs
