#include "fc1_factors.hpp"

#include <limits>

#include "kernels.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cpu {
namespace {
// 8 x 9216 floats, 288 KiB: a chunk stays in a core's L2 (1 MiB on the Zen 4 machine)
// while the update streams the chunk's parameters and state (288 KiB each) past it.
constexpr std::size_t kChunkRows = 8;
// The norm from the factors costs rows^2 / 2 dot products of 9344: beyond this many rows,
// more than writing the product whole and reading it back (`bench_step
// --benchmark_filter=^factors/`, the Zen 4 machine: 0.18 ms at 16 rows, 0.70 at 32, 11 at
// 128, against 0.27 ms for the write and two reads).
constexpr std::uint32_t kMostRowsKept = 16;
constexpr Range kWeights{kParams[4].offset, kParams[4].count};  // fc1.weight
constexpr std::size_t kAfter = kWeights.offset + kWeights.count;  // what follows fc1.weight
constexpr std::size_t kBiasAt = kParams[5].offset;                // fc1.bias
static_assert(kHidden % kChunkRows == 0);
}  // namespace

Fc1Factors::Fc1Factors(int world, std::uint32_t max_batch)
    : world_(world),
      capacity_(max_batch * static_cast<std::uint32_t>(world)),
      inputs_(aligned_zeros<float>(std::size_t{capacity_} * kFlat)),
      output_grads_(aligned_zeros<float>(std::size_t{capacity_} * kHidden)),
      chunk_(aligned_zeros<float>(kChunkRows * kFlat)) {}

void Fc1Factors::take(std::uint32_t rows, float* grads) {
  const float world = static_cast<float>(world_);
  float* g = output_grads();
  for (std::size_t i = 0, n = std::size_t{rows} * kHidden; i < n; ++i) g[i] /= world;
  fc1_bias_gradient(g, rows, grads + kBiasAt);
  rows_ = rows;
  if (rows > kMostRowsKept) materialize(grads);
}

double Fc1Factors::squares(const float* grads) const {
  // Exact products in double see no float overflow: past float's range (where an element
  // of the float product could be infinite) the norm counts as non-finite.
  constexpr double kFloatRange = double{std::numeric_limits<float>::max()} * std::numeric_limits<float>::max();
  const double fc1 = factor_product_squares(output_grads_.get(), inputs_.get(), rows_);
  return sum_of_squares(grads, kWeights.offset) + sum_of_squares(grads + kAfter, kParamCount - kAfter) +
         (fc1 >= kFloatRange ? std::numeric_limits<double>::infinity() : fc1);
}

void Fc1Factors::update(float* params, const float* grads, float* first, float* second,
                        const UpdateScalars& scalars) {
  optimizer_update(params, grads, first, second, kWeights.offset, scalars);
  optimizer_update(params + kAfter, grads + kAfter, first + kAfter, second + kAfter, kParamCount - kAfter, scalars);
  for (std::size_t row = 0; row < kHidden; row += kChunkRows) {
    factor_product_rows(output_grads_.get(), inputs_.get(), rows_, row, kChunkRows, chunk_.get());
    const std::size_t at = kWeights.offset + row * kFlat;
    optimizer_update(params + at, chunk_.get(), first + at, second + at, kChunkRows * kFlat, scalars);
  }
}

void Fc1Factors::materialize(float* grads) {
  if (rows_ == 0) return;
  // One call: each column panel of X is copied once for all 128 output rows.
  factor_product_rows(output_grads_.get(), inputs_.get(), rows_, 0, kHidden, grads + kWeights.offset);
  rows_ = 0;
}

}  // namespace mnist_mt::cpu
