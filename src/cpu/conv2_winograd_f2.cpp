#include "conv2_winograd_f2.hpp"

#include "conv2_tiles.hpp"
#include "mnist_mt/model.hpp"
#include "simd.hpp"

namespace mnist_mt::cpu {
namespace {

constexpr std::size_t kIc = kConv1Channels, kOc = kConv2Channels, kIn = kConv1Side, kOut = kConv2Side;
constexpr std::size_t kTileRow = 12;  // tiles per row of the map

// The one-dimensional transforms of F(2, 3); the two-dimensional ones apply them to the
// columns, then to the rows.
template <class T>
[[gnu::always_inline]] inline void bt4(const T (&d)[4], T (&r)[4]) {  // B^T d
  r[0] = d[0] - d[2];
  r[1] = d[1] + d[2];
  r[2] = d[2] - d[1];
  r[3] = d[1] - d[3];
}
template <class T>
[[gnu::always_inline]] inline void g3(const T (&w)[3], T (&u)[4]) {  // G w
  u[0] = w[0];
  u[1] = (w[0] + w[1] + w[2]) * 0.5f;
  u[2] = (w[0] - w[1] + w[2]) * 0.5f;
  u[3] = w[2];
}
template <class T>
[[gnu::always_inline]] inline void at4(const T (&m)[4], T (&y)[2]) {  // A^T m
  y[0] = m[0] + m[1] + m[2];
  y[1] = m[1] - m[2] - m[3];
}

struct ByBt {
  template <class T>
  [[gnu::always_inline]] void operator()(const T (&x)[4], T (&y)[4]) const { bt4(x, y); }
};
struct ByG {
  template <class T>
  [[gnu::always_inline]] void operator()(const T (&x)[3], T (&y)[4]) const { g3(x, y); }
};
struct ByAt {
  template <class T>
  [[gnu::always_inline]] void operator()(const T (&x)[4], T (&y)[2]) const { at4(x, y); }
};

template <std::size_t B>
[[gnu::always_inline]] inline void weights(const float* w, float* u) {
  for (std::size_t ob = 0; ob < kOc / B; ++ob)
    for (std::size_t ic = 0; ic < kIc; ++ic) {
      Vec<B> f[3][3], t[4][4];
      for (std::size_t i = 0; i < 9; ++i)
        for (std::size_t l = 0; l < B; ++l) f[i / 3][i % 3][l] = w[((ob * B + l) * kIc + ic) * 9 + i];
      separable<ByG>(f, t);
      for (std::size_t xi = 0; xi < kWinoF2Positions; ++xi) store<B>(u + (xi * kIc + ic) * kOc + ob * B, t[xi / 4][xi % 4]);
    }
}

template <std::size_t B>
[[gnu::always_inline]] inline void input(const float* a1, std::uint32_t images, std::size_t plane, float* v) {
  for (std::size_t n = 0; n < images; ++n)
    for (std::size_t t = 0; t < kWinoF2Tiles; ++t) {
      const std::size_t y0 = 2 * (t / kTileRow), x0 = 2 * (t % kTileRow);
      for (std::size_t cb = 0; cb < kIc / B; ++cb) {
        Vec<B> d[4][4], r[4][4];
        for (std::size_t i = 0; i < 4; ++i)
          for (std::size_t j = 0; j < 4; ++j) d[i][j] = load<B>(a1 + at_blocked<B>(kIc, kIn, n, cb, y0 + i, x0 + j));
        separable<ByBt>(d, r);
        float* out = v + (n * kWinoF2Tiles + t) * kIc + cb * B;
        for (std::size_t xi = 0; xi < kWinoF2Positions; ++xi) store<B>(out + xi * plane, r[xi / 4][xi % 4]);
      }
    }
}

template <std::size_t B>
[[gnu::always_inline]] inline void output(const float* m, std::uint32_t images, std::size_t plane, const float* bias,
                                          float* a2) {
  for (std::size_t n = 0; n < images; ++n)
    for (std::size_t t = 0; t < kWinoF2Tiles; ++t) {
      const std::size_t y0 = 2 * (t / kTileRow), x0 = 2 * (t % kTileRow);
      for (std::size_t ob = 0; ob < kOc / B; ++ob) {
        const float* in = m + (n * kWinoF2Tiles + t) * kOc + ob * B;
        Vec<B> q[4][4], y[2][2];
        for (std::size_t xi = 0; xi < kWinoF2Positions; ++xi) q[xi / 4][xi % 4] = load<B>(in + xi * plane);
        separable<ByAt>(q, y);
        const Vec<B> b = load<B>(bias + ob * B);
        for (std::size_t i = 0; i < 2; ++i)
          for (std::size_t j = 0; j < 2; ++j) store<B>(a2 + at_blocked<B>(kOc, kOut, n, ob, y0 + i, x0 + j), y[i][j] + b);
      }
    }
}

MNIST_MT_ISA_VARIANTS(weights, weights, (const float* w, float* u), (w, u))
MNIST_MT_ISA_VARIANTS(input, input, (const float* a1, std::uint32_t n, std::size_t plane, float* v), (a1, n, plane, v))
MNIST_MT_ISA_VARIANTS(output, output,
                      (const float* m, std::uint32_t n, std::size_t plane, const float* bias, float* a2),
                      (m, n, plane, bias, a2))

}  // namespace

WinogradF2Kernels winograd_f2_kernels(Isa isa) {
  return pick<WinogradF2Kernels>(isa, {weights_avx512, input_avx512, output_avx512},
                                 {weights_avx2, input_avx2, output_avx2}, {weights_portable, input_portable,
                                                                          output_portable});
}

}  // namespace mnist_mt::cpu
