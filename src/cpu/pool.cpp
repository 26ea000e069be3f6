#include "pool.hpp"

#include "mnist_mt/model.hpp"
#include "simd.hpp"

namespace mnist_mt::cpu {
namespace {

constexpr std::size_t kIn = kConv2Side, kOut = kPoolSide, kPlane = kOut * kOut;

template <std::size_t B>
using Mask = decltype(Vec<B>{} < Vec<B>{});

// One window as PyTorch's max_pool2d of ReLU sees it: a NaN is a maximum (the last one
// wins), passes the ReLU as NaN and gets no gradient from it. For the rows with a NaN.
inline void exact_window(const float* v, float& value, std::uint8_t& which) {
  std::uint8_t best = 0;
  for (std::uint8_t k = 1; k < 4; ++k)
    if (v[k] > v[best] || v[k] != v[k]) best = k;
  const float m = v[best];
  value = m != m ? m : m > 0 ? m : 0.0f;
  which = m > 0 ? best : kPoolNoGradient;
}

template <std::size_t B>
[[gnu::always_inline]] inline void forward(const float* in, std::uint32_t batch, float* out, std::uint8_t* argmax) {
  constexpr std::size_t kBlocks = kConv2Channels / B;
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t cb = 0; cb < kBlocks; ++cb) {
      const float* src = in + (n * kBlocks + cb) * kIn * kIn * B;
      float* dst = out + (n * kConv2Channels + cb * B) * kPlane;  // channel cb*B's plane
      std::uint8_t* idx = argmax + (n * kBlocks + cb) * kPlane * B;
      for (std::size_t py = 0; py < kOut; ++py) {
        float row[kOut][B];
        Vec<B> sum{};  // NaN (or an infinity's overflow) where a NaN may be: checked per row
        for (std::size_t px = 0; px < kOut; ++px) {
          const float* q = src + (2 * py * kIn + 2 * px) * B;
          const Vec<B> v[4] = {load<B>(q), load<B>(q + B), load<B>(q + kIn * B), load<B>(q + (kIn + 1) * B)};
          Vec<B> best = v[0];
          Mask<B> which{};
          for (int k = 1; k < 4; ++k) {
            const Mask<B> greater = v[k] > best;
            best = greater ? v[k] : best;
            which = greater ? Mask<B>{} + k : which;
          }
          sum += (v[0] + v[1]) + (v[2] + v[3]);
          const Mask<B> positive = best > 0;
          which = positive ? which : Mask<B>{} + kPoolNoGradient;
          const Vec<B> value = positive ? best : Vec<B>{};
          for (std::size_t c = 0; c < B; ++c) {
            row[px][c] = value[c];
            idx[(py * kOut + px) * B + c] = static_cast<std::uint8_t>(which[c]);
          }
        }
        const Mask<B> suspect = sum != sum;
        for (std::size_t c = 0; c < B; ++c)
          if (suspect[c])  // rare: redo this channel's row window by window
            for (std::size_t px = 0; px < kOut; ++px) {
              const float* q = src + (2 * py * kIn + 2 * px) * B + c;
              const float v[4] = {q[0], q[B], q[kIn * B], q[(kIn + 1) * B]};
              exact_window(v, row[px][c], idx[(py * kOut + px) * B + c]);
            }
        for (std::size_t c = 0; c < B; ++c)
          for (std::size_t px = 0; px < kOut; ++px) dst[c * kPlane + py * kOut + px] = row[px][c];
      }
    }
}

template <std::size_t B>
[[gnu::always_inline]] inline void backward(const float* d_out, const std::uint8_t* argmax, std::uint32_t batch,
                                            float* d_in) {
  constexpr std::size_t kBlocks = kConv2Channels / B;
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t cb = 0; cb < kBlocks; ++cb) {
      const float* src = d_out + (n * kConv2Channels + cb * B) * kPlane;
      const std::uint8_t* idx = argmax + (n * kBlocks + cb) * kPlane * B;
      float* dst = d_in + (n * kBlocks + cb) * kIn * kIn * B;
      for (std::size_t py = 0; py < kOut; ++py) {
        float row[kOut][B];
        for (std::size_t c = 0; c < B; ++c)
          for (std::size_t px = 0; px < kOut; ++px) row[px][c] = src[c * kPlane + py * kOut + px];
        for (std::size_t px = 0; px < kOut; ++px) {
          const Vec<B> g = load<B>(row[px]);
          Mask<B> which;
          for (std::size_t c = 0; c < B; ++c) which[c] = idx[(py * kOut + px) * B + c];
          float* q = dst + (2 * py * kIn + 2 * px) * B;
          store<B>(q, which == 0 ? g : Vec<B>{});
          store<B>(q + B, which == 1 ? g : Vec<B>{});
          store<B>(q + kIn * B, which == 2 ? g : Vec<B>{});
          store<B>(q + (kIn + 1) * B, which == 3 ? g : Vec<B>{});
        }
      }
    }
}

MNIST_MT_ISA_VARIANTS(forward, forward, (const float* in, std::uint32_t batch, float* out, std::uint8_t* argmax),
                      (in, batch, out, argmax))
MNIST_MT_ISA_VARIANTS(backward, backward,
                      (const float* d_out, const std::uint8_t* argmax, std::uint32_t batch, float* d_in),
                      (d_out, argmax, batch, d_in))

}  // namespace

PoolKernels pool_kernels(Isa isa) {
  return pick<PoolKernels>(isa, {forward_avx512, backward_avx512}, {forward_avx2, backward_avx2},
                          {forward_portable, backward_portable});
}

}  // namespace mnist_mt::cpu
