// fc1's backward products, per instruction set (simd.hpp): its weight gradient from every
// rank's gathered factors (--exchange factors) in chunks of rows, so that the update can
// take each chunk while it is in cache, and that product's squared norm from the factors
// alone; and, through the same product, one replica's backward passes where they are ours
// (own_fc1_backward in fc.hpp): G^T X for the weights, (G^T)^T W for the data.
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
// (and so do the output's rows), and each block re-fetched them from L2. 64 rows of a
// panel's kVecs x B columns are 12 KiB on AVX-512 (48 columns), 6 KiB on AVX2 (24), in L1
// beside the output rows' lines.
constexpr std::uint32_t kPanelRows = 64;

// out[i - first][c] = sum over r of g[r][i] x[r][c], for i in [first, first + count): g's
// rows g_stride floats apart, each readable from first to first + ceil(count / kOut<B>) x
// kOut<B> (only the range is written); x's and out's rows kFlat floats apart.
template <std::size_t B>
[[gnu::always_inline]] inline void factor_rows_body(const float* g, std::size_t g_stride, const float* x,
                                                    std::uint32_t rows, std::size_t first, std::size_t count,
                                                    float* out) {
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
        // Rows of out in this block; a short block goes through `tail`, so that the
        // accumulators are only indexed by constants and stay in registers.
        const std::size_t valid = first + count - i < kO ? first + count - i : kO;
        float* o = out + (i - first) * kFlat + j;
        Vec<B> acc[kO][kVecs] = {};
        alignas(64) float tail[kO][kW];  // a block past the range's end, through memory
        if (valid < kO) {
          __builtin_memset(tail, 0, sizeof tail);
          if (r0 > 0)
            for (std::size_t k = 0; k < valid; ++k) __builtin_memcpy(tail[k], o + k * kFlat, sizeof tail[k]);
        }
        if (r0 > 0)
#pragma GCC unroll 8
          for (std::size_t k = 0; k < kO; ++k)
#pragma GCC unroll 3
            for (std::size_t v = 0; v < kVecs; ++v)
              acc[k][v] = load<B>(valid == kO ? o + k * kFlat + v * B : &tail[k][v * B]);
        const float* gr = g + std::size_t{r0} * g_stride + i;
        for (std::uint32_t r = 0; r < n; ++r, gr += g_stride) {
          Vec<B> xv[kVecs];
          for (std::size_t v = 0; v < kVecs; ++v) xv[v] = load<B>(xp + r * x_stride + v * B);
          for (std::size_t k = 0; k < kO; ++k)
            for (std::size_t v = 0; v < kVecs; ++v) acc[k][v] += gr[k] * xv[v];
        }
#pragma GCC unroll 8
        for (std::size_t k = 0; k < kO; ++k)
#pragma GCC unroll 3
          for (std::size_t v = 0; v < kVecs; ++v) store<B>(valid == kO ? o + k * kFlat + v * B : &tail[k][v * B], acc[k][v]);
        if (valid < kO)
          for (std::size_t k = 0; k < valid; ++k) __builtin_memcpy(o + k * kFlat, tail[k], sizeof tail[k]);
      }
    }
  }
}

template <std::size_t B>
[[gnu::always_inline]] inline void factor_rows(const float* g, const float* x, std::uint32_t rows, std::size_t first,
                                               std::size_t count, float* out) {
  factor_rows_body<B>(g, kHidden, x, rows, first, count, out);
}
MNIST_MT_ISA_VARIANTS(factor_rows, factor_rows,
                      (const float* g, const float* x, std::uint32_t rows, std::size_t first, std::size_t count,
                       float* out),
                      (g, x, rows, first, count, out))

// fc1's backward (data): out[n] = sum over o of g[n][o] w[o], from G^T (kHidden rows of
// `stride` floats).
template <std::size_t B>
[[gnu::always_inline]] inline void backward_data(const float* g_t, std::size_t stride, const float* w,
                                                 std::size_t rows, float* out) {
  factor_rows_body<B>(g_t, stride, w, kHidden, 0, rows, out);
}
MNIST_MT_ISA_VARIANTS(backward_data, backward_data,
                      (const float* g_t, std::size_t stride, const float* w, std::size_t rows, float* out),
                      (g_t, stride, w, rows, out))
using BackwardDataFn = void (*)(const float*, std::size_t, const float*, std::size_t, float*);

}  // namespace

FactorRowsFn factor_product_rows_variant(Isa isa) {
  return pick<FactorRowsFn>(isa, factor_rows_avx512, factor_rows_avx2, factor_rows_portable);
}

void factor_product_rows(const float* g, const float* x, std::uint32_t rows, std::size_t first, std::size_t count,
                         float* out) {
  static const FactorRowsFn fn = factor_product_rows_variant(kernel_isa());
  fn(g, x, rows, first, count, out);
}

void fc1_bias_gradient(const float* g, std::uint32_t rows, float* bias) {
  for (std::size_t i = 0; i < kHidden; ++i) bias[i] = g[i];
  for (std::uint32_t r = 1; r < rows; ++r)
    for (std::size_t i = 0; i < kHidden; ++i) bias[i] += g[std::size_t{r} * kHidden + i];
}

void fc1_backward_weights(const float* g, const float* x, std::uint32_t rows, float* weights, float* bias, Isa isa) {
  factor_product_rows_variant(isa)(g, x, rows, 0, kHidden, weights);
  fc1_bias_gradient(g, rows, bias);
}

std::size_t fc1_transposed_stride(std::uint32_t rows) { return (std::size_t{rows} + 15) / 16 * 16; }

void fc1_backward_data(const float* g, const float* w, std::uint32_t rows, float* g_t, float* out, Isa isa) {
  const BackwardDataFn fn = pick<BackwardDataFn>(isa, backward_data_avx512, backward_data_avx2, backward_data_portable);
  const std::size_t stride = fc1_transposed_stride(rows);
  for (std::size_t n = 0; n < rows; ++n)
    for (std::size_t o = 0; o < kHidden; ++o) g_t[o * stride + n] = g[n * kHidden + o];
  fn(g_t, stride, w, rows, out);
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
