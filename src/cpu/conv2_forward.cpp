// conv2's forward: oneDNN's convolution on the blocked layout of the ISA, or our
// Winograd F(2x2, 3x3). Its backward is conv2_backward.cpp.
#include "conv2_forward.hpp"

#include <string_view>

#include "conv2_matmul.hpp"
#include "conv2_winograd.hpp"
#include "mnist_mt/model.hpp"
#include "plan_builder.hpp"

namespace mnist_mt::cpu {
namespace {

using Dims = memory::dims;
constexpr Dim kXi = kWinoF2Positions, kIc = kConv1Channels, kOc = kConv2Channels;
constexpr std::uint32_t kMaxChunk = 1;  // images: 144 tiles; chunks of 2 and 4 measured no faster
constexpr std::size_t kInImage = kConv1Channels * kConv1Side * kConv1Side;
constexpr std::size_t kOutImage = kConv2Channels * kConv2Side * kConv2Side;

}  // namespace

Conv2WinogradForward::Conv2WinogradForward(const dnnl::engine& engine, std::uint32_t batch, Isa isa)
    : kernels_(winograd_f2_kernels(isa)), batch_(batch), chunk_(chunk_for(batch, kMaxChunk)) {
  const Dim t = Dim{kWinoF2Tiles} * chunk_;
  plane_v_ = wino_plane(static_cast<std::size_t>(t), kIc);  // conv2_winograd.hpp's padding
  plane_m_ = wino_plane(static_cast<std::size_t>(t), kOc);
  u_ = aligned_zeros<float>(kXi * kIc * kOc);
  v_ = aligned_zeros<float>(kXi * plane_v_);
  m_ = aligned_zeros<float>(kXi * plane_m_);
  // Per position xi, rows are tiles: M = V U, with U stored [xi][ic][oc].
  const memory::desc v({kXi, t, kIc}, kF32, Dims{static_cast<Dim>(plane_v_), kIc, 1});
  const memory::desc u({kXi, kIc, kOc}, kF32, Dims{kIc * kOc, kOc, 1});
  const memory::desc m({kXi, t, kOc}, kF32, Dims{static_cast<Dim>(plane_m_), kOc, 1});
  const auto pd = make_batched_matmul(engine, v, u, m, false, kConv2Forward);
  product_ = bind_matmul(pd, engine, memories_, v_.get(), u_.get(), m_.get(), kConv2Forward);
  impl_ = std::string("own:") + isa_name(isa) + " winograd 2x3 + matmul " + pd.impl_info_str();
}

void Conv2WinogradForward::forward(const dnnl::stream& stream, const float* a1, const float* w, const float* bias,
                                   float* a2) {
  kernels_.weights(w, u_.get());
  for (std::uint32_t n = 0; n < batch_; n += chunk_) {
    kernels_.input(a1 + n * kInImage, chunk_, plane_v_, v_.get());
    run(product_, stream);
    kernels_.output(m_.get(), chunk_, plane_m_, bias, a2 + n * kOutImage);
  }
}

// conv2's forward, without the ReLU that the pooling applies: oneDNN's convolution (its
// weights reordered into oneDNN's layout) where it takes its Winograd or the ISA is SSE2,
// else ours.
void add_conv2_forward(PlanBuilder& b, Plan& plan, const Buffers& buf, Isa isa, float* params) {
  using namespace dnnl;
  const Dim n = plan.batch;
  const std::size_t cap = buf.max_batch;
  const memory::dims unit{1, 1}, zero{0, 0};
  const Tag blocked = channel_block(isa) == 16 ? Tag::nChw16c : Tag::nChw8c;
  const memory::desc a1_md({n, Dim{kConv1Channels}, Dim{kConv1Side}, Dim{kConv1Side}}, kF32, blocked);
  const memory::desc a2_md({n, Dim{kConv2Channels}, Dim{kConv2Side}, Dim{kConv2Side}}, kF32, blocked);
  const memory::desc any_w2({Dim{kConv2Channels}, Dim{kConv1Channels}, 3, 3}, kF32, Tag::any);
  const memory::desc bias_md = plain(kParams[3]);
  const auto fwd = planned(kConv2Forward, [&] {
    return convolution_forward::primitive_desc(
        convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_auto, a1_md, any_w2, bias_md,
                                  a2_md, unit, zero, zero),
        b.engine());
  });
  // Ours wherever oneDNN would run its direct convolution on AVX2 or AVX-512, which ours
  // beat as measured (AVX2, batch 64: 8.1 ms against 12.5 ms; AVX-512, batch 4: 0.54 ms
  // against 0.80 ms); oneDNN's Winograd F(4x4, 3x3) where it takes it (AVX-512 from 9
  // images at one thread), which beats ours (batch 64: 5.6 ms against 8.7 to 9.7 ms). On
  // SSE2 oneDNN's.
  const bool wino = std::string_view(fwd.impl_info_str()).find("wino") != std::string_view::npos;
  if (isa != Isa::kPortable && !wino) {
    plan.conv2_forward = std::make_unique<Conv2WinogradForward>(b.engine(), plan.batch, isa);
    plan.impl[kConv2Forward] = plan.conv2_forward->impl();
    return;
  }
  const std::size_t act1_count = cap * kConv1Channels * kConv1Side * kConv1Side;
  const std::size_t act2_count = cap * kConv2Channels * kConv2Side * kConv2Side;
  const memory a1 = b.bind(a1_md, buf.act1, act1_count), a2 = b.bind(a2_md, buf.act2, act2_count);
  const auto view = [&](int i, float* base) { return b.view(kParams[i], base); };
  const memory w2 = b.reordered(kConv2Forward, view(2, params), fwd.weights_desc(), plan.weights_to_forward);
  plan.conv2 = b.step(kConv2Forward, fwd,
                      {{DNNL_ARG_SRC, a1}, {DNNL_ARG_WEIGHTS, w2}, {DNNL_ARG_BIAS, view(3, params)},
                       {DNNL_ARG_DST, a2}});
}

}  // namespace mnist_mt::cpu
