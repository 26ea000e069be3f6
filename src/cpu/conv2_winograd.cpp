#include "conv2_winograd.hpp"

#include "conv2_tiles.hpp"
#include "mnist_mt/model.hpp"
#include "simd.hpp"

namespace mnist_mt::cpu {
namespace {

constexpr std::size_t kIc = kConv1Channels, kOc = kConv2Channels, kIn = kConv1Side, kOut = kConv2Side;
constexpr std::size_t kTileRow = 6;  // tiles per row of the map

// The one-dimensional transforms; the two-dimensional ones apply them to the columns,
// then to the rows, of a tile.
template <class T>
[[gnu::always_inline]] inline void bt(const T (&d)[6], T (&r)[6]) {  // B^T d
  r[0] = 4 * d[0] - 5 * d[2] + d[4];
  r[1] = -4 * (d[1] + d[2]) + d[3] + d[4];
  r[2] = 4 * (d[1] - d[2]) - d[3] + d[4];
  r[3] = 2 * (d[3] - d[1]) - d[2] + d[4];
  r[4] = 2 * (d[1] - d[3]) - d[2] + d[4];
  r[5] = 4 * d[1] - 5 * d[3] + d[5];
}
template <class T>
[[gnu::always_inline]] inline void b(const T (&x)[6], T (&r)[6]) {  // B x
  r[0] = 4 * x[0];
  r[1] = 4 * (x[2] - x[1] + x[5]) + 2 * (x[4] - x[3]);
  r[2] = -5 * x[0] - 4 * (x[1] + x[2]) - x[3] - x[4];
  r[3] = x[1] - x[2] + 2 * (x[3] - x[4]) - 5 * x[5];
  r[4] = x[0] + x[1] + x[2] + x[3] + x[4];
  r[5] = x[5];
}
template <class T>
[[gnu::always_inline]] inline void a(const T (&y)[4], T (&z)[6]) {  // A y
  const T e = y[0] + y[2], o = y[1] + y[3], e4 = y[0] + 4 * y[2], o2 = 2 * y[1] + 8 * y[3];
  z[0] = y[0];
  z[1] = e + o;
  z[2] = e - o;
  z[3] = e4 + o2;
  z[4] = e4 - o2;
  z[5] = y[3];
}
template <class T>
[[gnu::always_inline]] inline void g(const T (&w)[3], T (&u)[6]) {  // G w
  u[0] = w[0] / 4;
  u[1] = -(w[0] + w[1] + w[2]) / 6;
  u[2] = -(w[0] - w[1] + w[2]) / 6;
  u[3] = w[0] / 24 + w[1] / 12 + w[2] / 6;
  u[4] = w[0] / 24 - w[1] / 12 + w[2] / 6;
  u[5] = w[2];
}
template <class T>
[[gnu::always_inline]] inline void gt(const T (&x)[6], T (&h)[3]) {  // G^T x
  h[0] = x[0] / 4 - (x[1] + x[2]) / 6 + (x[3] + x[4]) / 24;
  h[1] = (x[2] - x[1]) / 6 + (x[3] - x[4]) / 12;
  h[2] = (x[3] + x[4] - x[1] - x[2]) / 6 + x[5];
}

// The transforms as function objects, inlined into each instruction set's entry point
// (a lambda would not take on the entry point's target attribute).
#define MNIST_MT_TRANSFORM(Name, fn, N, M)                                                  \
  struct Name {                                                                             \
    template <class T>                                                                      \
    [[gnu::always_inline]] void operator()(const T (&x)[N], T (&y)[M]) const { fn(x, y); } \
  };
MNIST_MT_TRANSFORM(ByBt, bt, 6, 6)
MNIST_MT_TRANSFORM(ByB, b, 6, 6)
MNIST_MT_TRANSFORM(ByA, a, 4, 6)
MNIST_MT_TRANSFORM(ByG, g, 3, 6)
MNIST_MT_TRANSFORM(ByGt, gt, 6, 3)
#undef MNIST_MT_TRANSFORM

// Both weight transforms run once a step whatever the batch (most of a batch-4 step's
// conv2 backward as scalar loops): vectors over B output channels, with the filters'
// stride-9 floats moved lane by lane. Each (ic, oc) pair's arithmetic is the scalar one.
template <std::size_t B>
[[gnu::always_inline]] inline void weights(const float* w, float* u) {
  for (std::size_t ob = 0; ob < kOc / B; ++ob)
    for (std::size_t ic = 0; ic < kIc; ++ic) {
      Vec<B> f[3][3], t[6][6];
      for (std::size_t i = 0; i < 9; ++i)
        for (std::size_t l = 0; l < B; ++l) f[i / 3][i % 3][l] = w[((ob * B + l) * kIc + ic) * 9 + i];
      separable<ByG>(f, t);
      for (std::size_t xi = 0; xi < kWinoPositions; ++xi) store<B>(u + (xi * kIc + ic) * kOc + ob * B, t[xi / 6][xi % 6]);
    }
}

template <std::size_t B>
[[gnu::always_inline]] inline void weights_grad(const float* du, float* dw) {
  for (std::size_t ob = 0; ob < kOc / B; ++ob)
    for (std::size_t ic = 0; ic < kIc; ++ic) {
      Vec<B> t[6][6], f[3][3];
      for (std::size_t xi = 0; xi < kWinoPositions; ++xi) t[xi / 6][xi % 6] = load<B>(du + (xi * kIc + ic) * kOc + ob * B);
      separable<ByGt>(t, f);
      for (std::size_t i = 0; i < 9; ++i)
        for (std::size_t l = 0; l < B; ++l) dw[((ob * B + l) * kIc + ic) * 9 + i] = f[i / 3][i % 3][l];
    }
}

template <std::size_t B>
[[gnu::always_inline]] inline void input(const float* a1, std::uint32_t images, float* v) {
  const std::size_t tiles = kWinoTiles * images;
  for (std::size_t n = 0; n < images; ++n)
    for (std::size_t t = 0; t < kWinoTiles; ++t)
      for (std::size_t cb = 0; cb < kIc / B; ++cb) {
        const std::size_t y0 = 4 * (t / kTileRow), x0 = 4 * (t % kTileRow);
        Vec<B> d[6][6], r[6][6];
        for (std::size_t i = 0; i < 6; ++i)
          for (std::size_t j = 0; j < 6; ++j) d[i][j] = load<B>(a1 + at_blocked<B>(kIc, kIn, n, cb, y0 + i, x0 + j));
        separable<ByBt>(d, r);
        float* out = v + (n * kWinoTiles + t) * kIc + cb * B;
        for (std::size_t xi = 0; xi < kWinoPositions; ++xi)
          store<B>(out + xi * wino_plane(tiles, kIc), r[xi / 6][xi % 6]);
      }
}

// Where output_grad reads a 4x4 tile of conv2's output gradient dy: from the map d_a2,
// or (Pooled) from the gradient of the max pool's output and its argmax, as the pool's
// backward would have written d_a2 (the tile holds 2x2 whole pooling windows).
template <std::size_t B>
struct FromMap {
  const float* d_a2;
  [[gnu::always_inline]] void tile(std::size_t n, std::size_t cb, std::size_t y0, std::size_t x0,
                                   Vec<B> (&dy)[4][4]) const {
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 4; ++j) dy[i][j] = load<B>(d_a2 + at_blocked<B>(kOc, kOut, n, cb, y0 + i, x0 + j));
  }
};
template <std::size_t B>
struct Pooled {
  const float* d_pool;         // images x 64 x 12 x 12 (PyTorch's flatten order)
  const std::uint8_t* argmax;  // images x 64/B x 12 x 12 x B: 0..3, or kPoolNoGradient
  [[gnu::always_inline]] void tile(std::size_t n, std::size_t cb, std::size_t y0, std::size_t x0,
                                   Vec<B> (&dy)[4][4]) const {
    using Mask = decltype(Vec<B>{} < Vec<B>{});
    for (std::size_t wy = 0; wy < 2; ++wy)
      for (std::size_t wx = 0; wx < 2; ++wx) {
        const std::size_t window = (y0 / 2 + wy) * kPoolSide + x0 / 2 + wx;
        const float* g_at = d_pool + (n * kOc + cb * B) * kPoolSide * kPoolSide + window;
        const std::uint8_t* which_at = argmax + ((n * (kOc / B) + cb) * kPoolSide * kPoolSide + window) * B;
        Vec<B> g;
        Mask which;
        for (std::size_t c = 0; c < B; ++c) {
          g[c] = g_at[c * kPoolSide * kPoolSide];
          which[c] = which_at[c];
        }
        for (std::size_t k = 0; k < 4; ++k)
          dy[2 * wy + k / 2][2 * wx + k % 2] = which == static_cast<int>(k) ? g : Vec<B>{};
      }
  }
};

template <std::size_t B, class Source>
[[gnu::always_inline]] inline void output_grad_from(const Source& source, std::uint32_t images, float* z, double* db) {
  const std::size_t tiles = kWinoTiles * images;
  for (std::size_t cb = 0; cb < kOc / B; ++cb) {
    Vec<B> sum{};
    for (std::size_t n = 0; n < images; ++n)
      for (std::size_t t = 0; t < kWinoTiles; ++t) {
        const std::size_t y0 = 4 * (t / kTileRow), x0 = 4 * (t % kTileRow);
        Vec<B> dy[4][4], r[6][6];
        source.tile(n, cb, y0, x0, dy);
        for (std::size_t i = 0; i < 4; ++i)
          for (std::size_t j = 0; j < 4; ++j) sum += dy[i][j];
        separable<ByA>(dy, r);
        float* out = z + (n * kWinoTiles + t) * kOc + cb * B;
        for (std::size_t xi = 0; xi < kWinoPositions; ++xi)
          store<B>(out + xi * wino_plane(tiles, kOc), r[xi / 6][xi % 6]);
      }
    for (std::size_t c = 0; c < B; ++c) db[cb * B + c] += sum[c];
  }
}

template <std::size_t B>
[[gnu::always_inline]] inline void input_grad(const float* dv, std::uint32_t images, float* d_a1) {
  const std::size_t tiles = kWinoTiles * images;
  for (std::size_t n = 0; n < images; ++n)
    for (std::size_t cb = 0; cb < kIc / B; ++cb) {
      // Tiles overlap by two rows and columns: the first tile to reach a row or column
      // writes it, later ones add.
      for (std::size_t t = 0; t < kWinoTiles; ++t) {
        const std::size_t ty = t / kTileRow, tx = t % kTileRow;
        const float* in = dv + (n * kWinoTiles + t) * kIc + cb * B;
        Vec<B> q[6][6], r[6][6];
        for (std::size_t xi = 0; xi < kWinoPositions; ++xi)
          q[xi / 6][xi % 6] = load<B>(in + xi * wino_plane(tiles, kIc));
        separable<ByB>(q, r);
        for (std::size_t i = 0; i < 6; ++i)
          for (std::size_t j = 0; j < 6; ++j) {
            float* p = d_a1 + at_blocked<B>(kIc, kIn, n, cb, 4 * ty + i, 4 * tx + j);
            const bool first = (i >= 2 || ty == 0) && (j >= 2 || tx == 0);
            store<B>(p, first ? r[i][j] : load<B>(p) + r[i][j]);
          }
      }
    }
}

MNIST_MT_ISA_VARIANTS(weights, weights, (const float* w, float* u), (w, u))
MNIST_MT_ISA_VARIANTS(weights_grad, weights_grad, (const float* du, float* dw), (du, dw))
MNIST_MT_ISA_VARIANTS(input, input, (const float* a1, std::uint32_t n, float* v), (a1, n, v))
template <std::size_t B>
[[gnu::always_inline]] inline void output_grad(const float* d_a2, std::uint32_t images, float* z, double* db) {
  output_grad_from<B>(FromMap<B>{d_a2}, images, z, db);
}
template <std::size_t B>
[[gnu::always_inline]] inline void pooled_output_grad(const float* d_pool, const std::uint8_t* argmax,
                                                      std::uint32_t images, float* z, double* db) {
  output_grad_from<B>(Pooled<B>{d_pool, argmax}, images, z, db);
}

MNIST_MT_ISA_VARIANTS(output_grad, output_grad, (const float* d, std::uint32_t n, float* z, double* db),
                      (d, n, z, db))
MNIST_MT_ISA_VARIANTS(pooled_output_grad, pooled_output_grad,
                      (const float* d, const std::uint8_t* argmax, std::uint32_t n, float* z, double* db),
                      (d, argmax, n, z, db))
MNIST_MT_ISA_VARIANTS(input_grad, input_grad, (const float* dv, std::uint32_t n, float* d), (dv, n, d))

}  // namespace

WinogradKernels winograd_kernels(Isa isa) {
  return pick<WinogradKernels>(
      isa,
      {weights_avx512, input_avx512, output_grad_avx512, pooled_output_grad_avx512, input_grad_avx512,
       weights_grad_avx512},
      {weights_avx2, input_avx2, output_grad_avx2, pooled_output_grad_avx2, input_grad_avx2, weights_grad_avx2},
      {weights_portable, input_portable, output_grad_portable, pooled_output_grad_portable, input_grad_portable,
       weights_grad_portable});
}

}  // namespace mnist_mt::cpu
