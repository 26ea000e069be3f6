#include "conv2_backward.hpp"

#include <cstring>

#include "conv2_matmul.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cpu {
namespace {

using dnnl::memory;
using Dims = memory::dims;
constexpr auto kF32 = memory::data_type::f32;
constexpr memory::dim kXi = kWinoPositions, kIc = kConv1Channels, kOc = kConv2Channels;
constexpr std::uint32_t kMaxChunk = 2;  // images: 72 tiles; larger chunks measured slower (cache)
constexpr std::size_t kInImage = kConv1Channels * kConv1Side * kConv1Side;
constexpr std::size_t kOutImage = kConv2Channels * kConv2Side * kConv2Side;

}  // namespace

Conv2WinogradBackward::Conv2WinogradBackward(const dnnl::engine& engine, std::uint32_t batch, Isa isa)
    : kernels_(winograd_kernels(isa)), batch_(batch), chunk_(chunk_for(batch, kMaxChunk)) {
  const memory::dim t = memory::dim{kWinoTiles} * chunk_;
  const memory::dim pv = wino_plane(t, kIc), pz = wino_plane(t, kOc);
  u_ = aligned_zeros<float>(kXi * kIc * kOc);
  du_ = aligned_zeros<float>(kXi * kIc * kOc);
  v_ = aligned_zeros<float>(kXi * pv);
  z_ = aligned_zeros<float>(kXi * pz);
  dv_ = aligned_zeros<float>(kXi * pv);
  // Per position xi, rows are tiles: dV = Z U^T and dU += V^T Z, with U stored
  // [xi][ic][oc]; U^T and V^T are strided views.
  const memory::desc v({kXi, t, kIc}, kF32, Dims{pv, kIc, 1});
  const memory::desc vt({kXi, kIc, t}, kF32, Dims{pv, 1, kIc});
  const memory::desc u({kXi, kIc, kOc}, kF32, Dims{kIc * kOc, kOc, 1});
  const memory::desc ut({kXi, kOc, kIc}, kF32, Dims{kIc * kOc, 1, kOc});
  const memory::desc z({kXi, t, kOc}, kF32, Dims{pz, kOc, 1});
  const auto data = make_batched_matmul(engine, z, ut, v, false, kConv2Backward);
  const auto weights = make_batched_matmul(engine, vt, z, u, true, kConv2Backward);
  backward_data_ = bind_matmul(data, engine, memories_, z_.get(), u_.get(), dv_.get(), kConv2Backward);
  backward_weights_ = bind_matmul(weights, engine, memories_, v_.get(), z_.get(), du_.get(), kConv2Backward);
  impl_ = std::string("own:") + isa_name(isa) + " winograd 4x3 + matmul " + data.impl_info_str() + ", " +
          weights.impl_info_str();
}

template <class OutputGrad>
void Conv2WinogradBackward::chunks(const dnnl::stream& stream, const float* a1, const float* w,
                                   const OutputGrad& output_grad, float* dw, float* db, float* d_a1) {
  kernels_.weights(w, u_.get());
  std::memset(du_.get(), 0, kXi * kIc * kOc * sizeof(float));
  double bias[kConv2Channels] = {};
  for (std::uint32_t n = 0; n < batch_; n += chunk_) {
    output_grad(n, bias);
    kernels_.input(a1 + n * kInImage, chunk_, v_.get());
    run(backward_weights_, stream);
    run(backward_data_, stream);
    kernels_.input_grad(dv_.get(), chunk_, d_a1 + n * kInImage);
  }
  kernels_.weights_grad(du_.get(), dw);
  for (std::size_t c = 0; c < kConv2Channels; ++c) db[c] = static_cast<float>(bias[c]);
}

void Conv2WinogradBackward::backward(const dnnl::stream& stream, const float* a1, const float* w, const float* d_a2,
                                     float* dw, float* db, float* d_a1) {
  chunks(
      stream, a1, w,
      [&](std::uint32_t n, double* bias) { kernels_.output_grad(d_a2 + n * kOutImage, chunk_, z_.get(), bias); }, dw,
      db, d_a1);
}

void Conv2WinogradBackward::backward_pooled(const dnnl::stream& stream, const float* a1, const float* w,
                                            const float* d_pool, const std::uint8_t* argmax, float* dw, float* db,
                                            float* d_a1) {
  chunks(
      stream, a1, w,
      [&](std::uint32_t n, double* bias) {
        kernels_.pooled_output_grad(d_pool + n * kFlat, argmax + n * kFlat, chunk_, z_.get(), bias);
      },
      dw, db, d_a1);
}

}  // namespace mnist_mt::cpu
