#pragma once
// The float64 reference of a valid, stride-1 cross-correlation (the network's two
// convolutions), forward and backward, written from the definition: the one reference
// of the CPU kernels' tests (test_cpu_kernels.cpp: conv1, conv2's backward) and of the
// cuDNN tests (test_cuda_kernels.cpp). Tensors are NCHW, weights [out][in][k][k].
#include <cmath>
#include <cstddef>
#include <vector>

namespace mnist_mt::testing_reference {

// Each value and the sum of |terms| behind it, so a test can bound the rounding of an
// fp32 sum of those terms.
struct Sums {
  std::vector<double> value;
  std::vector<double> magnitude;
  explicit Sums(std::size_t count) : value(count), magnitude(count) {}
  void add(std::size_t i, double term) {
    value[i] += term;
    magnitude[i] += std::abs(term);
  }
};

struct ConvGeometry {
  std::size_t batch, in_channels, out_channels, in_side, kernel;
  std::size_t out_side() const { return in_side - kernel + 1; }
  std::size_t x_index(std::size_t n, std::size_t c, std::size_t y, std::size_t x) const {
    return ((n * in_channels + c) * in_side + y) * in_side + x;
  }
  std::size_t y_index(std::size_t n, std::size_t k, std::size_t y, std::size_t x) const {
    return ((n * out_channels + k) * out_side() + y) * out_side() + x;
  }
};

// y = w * x (no bias), and from dy: dw, db (dy summed per output channel) and dx; with
// dy empty, y alone.
struct ConvSums {
  Sums y, dw, db, dx;
};

inline ConvSums conv_reference(const ConvGeometry& g, const std::vector<float>& x, const std::vector<float>& w,
                               const std::vector<float>& dy) {
  const std::size_t out = g.out_side(), kk = g.kernel;
  const bool backward = !dy.empty();
  ConvSums r{Sums(g.batch * g.out_channels * out * out), Sums(w.size()), Sums(g.out_channels), Sums(x.size())};
  for (std::size_t n = 0; n < g.batch; ++n)
    for (std::size_t k = 0; k < g.out_channels; ++k) {
      for (std::size_t oy = 0; oy < out && backward; ++oy)
        for (std::size_t ox = 0; ox < out; ++ox) r.db.add(k, dy[g.y_index(n, k, oy, ox)]);
      for (std::size_t c = 0; c < g.in_channels; ++c)
        for (std::size_t ky = 0; ky < kk; ++ky)
          for (std::size_t kx = 0; kx < kk; ++kx) {
            const std::size_t wi = ((k * g.in_channels + c) * kk + ky) * kk + kx;
            const double wv = w[wi];
            for (std::size_t oy = 0; oy < out; ++oy)
              for (std::size_t ox = 0; ox < out; ++ox) {
                const std::size_t xi = g.x_index(n, c, oy + ky, ox + kx), yi = g.y_index(n, k, oy, ox);
                r.y.add(yi, wv * x[xi]);
                if (!backward) continue;
                r.dw.add(wi, double{dy[yi]} * x[xi]);
                r.dx.add(xi, double{dy[yi]} * wv);
              }
          }
    }
  return r;
}

}  // namespace mnist_mt::testing_reference
