#pragma once
// Inputs and the comparison shared by the tests of the CUDA kernels' references
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

}  // namespace mnist_mt::testing_inputs
