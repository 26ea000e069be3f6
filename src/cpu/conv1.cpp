#include "conv1.hpp"

#include "mnist_mt/model.hpp"
#include "simd.hpp"

namespace mnist_mt::cpu {
namespace {

constexpr std::size_t kIn = kImageSide, kOut = kConv1Side, kTaps = 9;

template <std::size_t B>
[[gnu::always_inline]] inline void forward(const float* x, const float* w, const float* b, std::uint32_t batch,
                                           float* out) {
  constexpr std::size_t kBlocks = kConv1Channels / B;
  for (std::size_t cb = 0; cb < kBlocks; ++cb) {
    Vec<B> wv[kTaps], bias;
    for (std::size_t c = 0; c < B; ++c) {
      for (std::size_t k = 0; k < kTaps; ++k) wv[k][c] = w[(cb * B + c) * kTaps + k];
      bias[c] = b[cb * B + c];
    }
    for (std::size_t n = 0; n < batch; ++n) {
      const float* img = x + n * kIn * kIn;
      float* o = out + (n * kBlocks + cb) * kOut * kOut * B;
      for (std::size_t y = 0; y < kOut; ++y)
        for (std::size_t xo = 0; xo < kOut; ++xo) {
          Vec<B> acc = bias;
          for (std::size_t ky = 0; ky < 3; ++ky)
            for (std::size_t kx = 0; kx < 3; ++kx) acc += img[(y + ky) * kIn + xo + kx] * wv[ky * 3 + kx];
          store<B>(o + (y * kOut + xo) * B, acc < 0 ? Vec<B>{} : acc);  // NaN passes, as in PyTorch
        }
    }
  }
}

template <std::size_t B>
[[gnu::always_inline]] inline void backward_weights(const float* x, const float* out, const float* d_out,
                                                    std::uint32_t batch, float* dw, float* db) {
  constexpr std::size_t kBlocks = kConv1Channels / B;
  for (std::size_t cb = 0; cb < kBlocks; ++cb) {
    // fp32 sums over one image's 676 positions, added up across the batch in fp64.
    double total[kTaps + 1][B] = {};
    for (std::size_t n = 0; n < batch; ++n) {
      const float* img = x + n * kIn * kIn;
      const std::size_t base = (n * kBlocks + cb) * kOut * kOut * B;
      Vec<B> acc[kTaps + 1] = {};
      for (std::size_t y = 0; y < kOut; ++y)
        for (std::size_t xo = 0; xo < kOut; ++xo) {
          const std::size_t at = base + (y * kOut + xo) * B;
          const Vec<B> d = load<B>(out + at) > 0 ? load<B>(d_out + at) : Vec<B>{};
          for (std::size_t ky = 0; ky < 3; ++ky)
            for (std::size_t kx = 0; kx < 3; ++kx) acc[ky * 3 + kx] += img[(y + ky) * kIn + xo + kx] * d;
          acc[kTaps] += d;
        }
      for (std::size_t k = 0; k <= kTaps; ++k)
        for (std::size_t c = 0; c < B; ++c) total[k][c] += acc[k][c];
    }
    for (std::size_t c = 0; c < B; ++c) {
      for (std::size_t k = 0; k < kTaps; ++k) dw[(cb * B + c) * kTaps + k] = static_cast<float>(total[k][c]);
      db[cb * B + c] = static_cast<float>(total[kTaps][c]);
    }
  }
}

MNIST_MT_ISA_VARIANTS(forward, forward,
                      (const float* x, const float* w, const float* b, std::uint32_t batch, float* out),
                      (x, w, b, batch, out))
MNIST_MT_ISA_VARIANTS(backward_weights, backward_weights,
                      (const float* x, const float* out, const float* d_out, std::uint32_t batch, float* dw,
                       float* db),
                      (x, out, d_out, batch, dw, db))

}  // namespace

Conv1Kernels conv1_kernels(Isa isa) {
  return pick<Conv1Kernels>(isa, {forward_avx512, backward_weights_avx512}, {forward_avx2, backward_weights_avx2},
                           {forward_portable, backward_weights_portable});
}

}  // namespace mnist_mt::cpu
