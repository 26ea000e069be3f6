// conv2's forward: oneDNN's convolution on the blocked layout of the ISA. Its backward
// is conv2_backward.cpp.
#include "conv2.hpp"

namespace mnist_mt::cpu {

// conv2's forward through oneDNN's convolution (Winograd on AVX-512, direct otherwise),
// without the ReLU that the pooling applies; weights reordered into oneDNN's layout.
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
