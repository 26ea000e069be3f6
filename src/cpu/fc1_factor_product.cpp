// fc1's weight gradient from every rank's gathered factors (--exchange factors), per
// instruction set (simd.hpp): the product in chunks of rows, so that the update can take
// each chunk while it is in cache, and the product's squared norm from the factors alone.
#include "kernels.hpp"
#include "mnist_mt/model.hpp"
#include "simd.hpp"

namespace mnist_mt::cpu {
namespace {

// A block of kOut<B> output rows x kVecs vectors of B columns keeps its accumulators in
// registers: 8 x 3 on AVX-512 (24 of its 32), 4 x 3 on AVX2 (12 of 16).
template <std::size_t B>
constexpr std::size_t kOut = B == 16 ? 8 : 4;
constexpr std::size_t kVecs = 3;
// Rows of X a pass takes, copied into a contiguous panel: X's rows are 36 KiB apart, a
// multiple of 4 KiB, so read in place the rows of a column panel all fall in one L1 set
// (and so do the output's rows), and each block re-fetched them from L2. 64 rows of
// 48 columns are 12 KiB, in L1 beside the output rows' lines.
constexpr std::uint32_t kPanelRows = 64;

template <std::size_t B>
[[gnu::always_inline]] inline void factor_rows_body(const float* g, const float* x, std::uint32_t rows,
                                                    std::size_t first, std::size_t count, float* out) {
  constexpr std::size_t kO = kOut<B>, kW = kVecs * B;
  static_assert(kFlat % kW == 0);
  alignas(64) float panel[kPanelRows * kW];
  // A range of one block of output rows reads each panel once: it reads X in place.
  const bool copy = count > kO;
  // Columns in panels and rows in blocks of kPanelRows, each pass adding its rows to the
  // sums so far in `out` (a stored float reloaded is the same value: each element's chain
  // of multiply-adds stays in row order, whatever the blocks); every output row of the
  // range takes the panel while it is in L1.
  for (std::uint32_t r0 = 0; r0 < rows; r0 += kPanelRows) {
    const std::uint32_t n = rows - r0 < kPanelRows ? rows - r0 : kPanelRows;
    for (std::size_t j = 0; j < kFlat; j += kW) {
      const float* xp = x + std::size_t{r0} * kFlat + j;
      std::size_t x_stride = kFlat;
      if (copy) {
        for (std::uint32_t r = 0; r < n; ++r)
          for (std::size_t v = 0; v < kVecs; ++v) store<B>(panel + r * kW + v * B, load<B>(xp + r * kFlat + v * B));
        xp = panel;
        x_stride = kW;
      }
      for (std::size_t i = first; i < first + count; i += kO) {
        Vec<B> acc[kO][kVecs] = {};
        if (r0 > 0)
          for (std::size_t k = 0; k < kO; ++k)
            for (std::size_t v = 0; v < kVecs; ++v) acc[k][v] = load<B>(out + (i - first + k) * kFlat + j + v * B);
        const float* gr = g + std::size_t{r0} * kHidden + i;
        for (std::uint32_t r = 0; r < n; ++r, gr += kHidden) {
          Vec<B> xv[kVecs];
          for (std::size_t v = 0; v < kVecs; ++v) xv[v] = load<B>(xp + r * x_stride + v * B);
          for (std::size_t k = 0; k < kO; ++k)
            for (std::size_t v = 0; v < kVecs; ++v) acc[k][v] += gr[k] * xv[v];
        }
        for (std::size_t k = 0; k < kO; ++k)
          for (std::size_t v = 0; v < kVecs; ++v) store<B>(out + (i - first + k) * kFlat + j + v * B, acc[k][v]);
      }
    }
  }
}

MNIST_MT_ISA_VARIANTS(factor_rows, factor_rows_body,
                      (const float* g, const float* x, std::uint32_t rows, std::size_t first, std::size_t count,
                       float* out),
                      (g, x, rows, first, count, out))

}  // namespace

FactorRowsFn factor_product_rows_variant(Isa isa) {
  return pick<FactorRowsFn>(isa, factor_rows_avx512, factor_rows_avx2, factor_rows_portable);
}

void factor_product_rows(const float* g, const float* x, std::uint32_t rows, std::size_t first, std::size_t count,
                         float* out) {
  static const FactorRowsFn fn = factor_product_rows_variant(kernel_isa());
  fn(g, x, rows, first, count, out);
}

// ||G^T X||^2 = sum over row pairs (a, b) of (g_a . g_b)(x_a . x_b). The dot products run
// on the ISA's vectors (norm.cpp's, in lane order); their products and sum here, in
// baseline code, where nothing fuses a multiply with an add: the same bits on every ISA.
double factor_product_squares(const float* g, const float* x, std::uint32_t rows, Isa isa) {
  const DotFn dot = dot_in_order_variant(isa);
  double total = 0;
  for (std::uint32_t a = 0; a < rows; ++a) {
    for (std::uint32_t b = 0; b <= a; ++b) {
      double gg = 0, xx = 0;
      dot(g + std::size_t{a} * kHidden, g + std::size_t{b} * kHidden, kHidden, &gg);
      dot(x + std::size_t{a} * kFlat, x + std::size_t{b} * kFlat, kFlat, &xx);
      total += (a == b ? 1.0 : 2.0) * gg * xx;
    }
  }
  return total;
}

}  // namespace mnist_mt::cpu
