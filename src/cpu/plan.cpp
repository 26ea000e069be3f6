#include "plan.hpp"

#include <initializer_list>
#include <utility>

#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dim = memory::dim;
constexpr auto kF32 = memory::data_type::f32;

memory::desc plain(const ParamInfo& p) {
  memory::dims dims(p.shape.begin(), p.shape.begin() + p.dims);
  return {dims, kF32, p.dims == 4 ? Tag::oihw : p.dims == 2 ? Tag::oi : Tag::x};
}

class PlanBuilder {
 public:
  PlanBuilder(const dnnl::engine& engine, Plan& plan) : engine_(engine), plan_(plan) {
    dnnl::post_ops relu;
    relu.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    relu_attr_.set_post_ops(relu);
  }
  const dnnl::engine& engine() const { return engine_; }
  const dnnl::primitive_attr& relu_attr() const { return relu_attr_; }

  // Memory over a buffer of the replica, which must hold the descriptor's bytes.
  memory bind(const memory::desc& desc, void* data, std::size_t capacity_bytes) {
    if (desc.get_size() > capacity_bytes)
      throw RuntimeFailure("oneDNN layout for batch " + std::to_string(plan_.batch) + " needs " +
                           std::to_string(desc.get_size()) + " bytes, its buffer holds " +
                           std::to_string(capacity_bytes));
    return plan_.memories.emplace_back(desc, engine_, data);
  }
  template <class T>
  memory bind(const memory::desc& desc, const Aligned<T>& buffer, std::size_t capacity_count) {
    return bind(desc, buffer.get(), capacity_count * sizeof(T));
  }
  // A parameter (or its gradient) in its state-dict layout, inside the flat buffer at `base`.
  memory view(const ParamInfo& p, float* base) { return bind(plain(p), base + p.offset, p.count * sizeof(float)); }

  // A primitive bound to its arguments, recorded as (part of) operation `op`.
  template <class Pd>
  Step step(Op op, const Pd& pd, std::initializer_list<std::pair<int, memory>> args, const char* what = "") {
    std::string& impl = plan_.impl[op];
    impl += (impl.empty() ? "" : " + ") + std::string(what) + pd.impl_info_str();
    Step s{dnnl::primitive(pd.get()), {}, op};
    for (const auto& [arg, mem] : args) s.args.push_back({arg, mem.get()});
    return s;
  }

  // `user` itself when `wanted` is its layout; otherwise a buffer of the plan in the
  // wanted layout, filled by a reorder from `user` that is added to `steps`.
  memory reordered(Op op, const memory& user, const memory::desc& wanted, std::vector<Step>& steps) {
    if (wanted == user.get_desc()) return user;
    auto& owned = plan_.owned.emplace_back(aligned_zeros<float>(wanted.get_size() / sizeof(float)));
    const memory buffer = plan_.memories.emplace_back(wanted, engine_, owned.get());
    steps.push_back(step(op, dnnl::reorder::primitive_desc(engine_, user.get_desc(), engine_, wanted),
                         {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, buffer}}, "reorder "));
    return buffer;
  }

 private:
  const dnnl::engine& engine_;
  Plan& plan_;
  dnnl::primitive_attr relu_attr_;
};

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
  const convolution_forward::primitive_desc fwd(
      convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_auto, a1_md, any_w2, bias_md,
                                a2_md, unit, zero, zero),
      b.engine());
  const std::size_t act1_count = cap * kConv1Channels * kConv1Side * kConv1Side;
  const std::size_t act2_count = cap * kConv2Channels * kConv2Side * kConv2Side;
  const memory a1 = b.bind(a1_md, buf.act1, act1_count), a2 = b.bind(a2_md, buf.act2, act2_count);
  const auto view = [&](int i, float* base) { return b.view(kParams[i], base); };
  const memory w2 = b.reordered(kConv2Forward, view(2, params), fwd.weights_desc(), plan.weights_to_forward);
  plan.conv2 = b.step(kConv2Forward, fwd,
                      {{DNNL_ARG_SRC, a1}, {DNNL_ARG_WEIGHTS, w2}, {DNNL_ARG_BIAS, view(3, params)},
                       {DNNL_ARG_DST, a2}});
}

// fc1 (ReLU fused) and fc2 through oneDNN's inner products, on PyTorch's flatten order:
// the pooled map nchw seen as [n, 9216].
void add_fc(PlanBuilder& b, Plan& plan, const Buffers& buf, float* params, float* grads) {
  using namespace dnnl;
  const Dim n = plan.batch;
  const std::size_t cap = buf.max_batch;
  const memory::desc flat_md({n, Dim{kFlat}}, kF32, Tag::nc), hidden_md({n, Dim{kHidden}}, kF32, Tag::nc);
  const memory::desc logits_md({n, Dim{kClasses}}, kF32, Tag::nc);
  const auto desc = [](int i) { return plain(kParams[i]); };
  const inner_product_forward::primitive_desc fc1_pd(
      inner_product_forward::desc(prop_kind::forward_training, flat_md, desc(4), desc(5), hidden_md), b.relu_attr(),
      b.engine());
  const inner_product_forward::primitive_desc fc2_pd(
      inner_product_forward::desc(prop_kind::forward_training, hidden_md, desc(6), desc(7), logits_md), b.engine());
  const inner_product_backward_weights::primitive_desc fc2_bw_pd(
      inner_product_backward_weights::desc(hidden_md, desc(6), desc(7), logits_md), b.engine(), fc2_pd);
  const inner_product_backward_data::primitive_desc fc2_bd_pd(
      inner_product_backward_data::desc(hidden_md, desc(6), logits_md), b.engine(), fc2_pd);
  const inner_product_backward_weights::primitive_desc fc1_bw_pd(
      inner_product_backward_weights::desc(flat_md, desc(4), desc(5), hidden_md), b.engine(), fc1_pd);
  const inner_product_backward_data::primitive_desc fc1_bd_pd(
      inner_product_backward_data::desc(flat_md, desc(4), hidden_md), b.engine(), fc1_pd);

  const memory flat = b.bind(flat_md, buf.flat, cap * kFlat), d_flat = b.bind(flat_md, buf.d_flat, cap * kFlat);
  const memory hidden = b.bind(hidden_md, buf.hidden, cap * kHidden);
  const memory d_hidden = b.bind(hidden_md, buf.d_hidden, cap * kHidden);
  const memory logits = b.bind(logits_md, buf.logits, cap * kClasses);
  const memory dlogits = b.bind(logits_md, buf.dlogits, cap * kClasses);
  const auto view = [&](int i, float* base) { return b.view(kParams[i], base); };
  plan.fc1 = b.step(kFc1Forward, fc1_pd, {{DNNL_ARG_SRC, flat}, {DNNL_ARG_WEIGHTS, view(4, params)},
                                          {DNNL_ARG_BIAS, view(5, params)}, {DNNL_ARG_DST, hidden}});
  plan.fc2 = b.step(kFc2Forward, fc2_pd, {{DNNL_ARG_SRC, hidden}, {DNNL_ARG_WEIGHTS, view(6, params)},
                                          {DNNL_ARG_BIAS, view(7, params)}, {DNNL_ARG_DST, logits}});
  plan.fc2_backward_weights = b.step(kFc2BackwardWeights, fc2_bw_pd,
                                     {{DNNL_ARG_SRC, hidden}, {DNNL_ARG_DIFF_DST, dlogits},
                                      {DNNL_ARG_DIFF_WEIGHTS, view(6, grads)}, {DNNL_ARG_DIFF_BIAS, view(7, grads)}});
  plan.fc2_backward_data = b.step(kFc2BackwardData, fc2_bd_pd,
                                  {{DNNL_ARG_DIFF_DST, dlogits}, {DNNL_ARG_WEIGHTS, view(6, params)},
                                   {DNNL_ARG_DIFF_SRC, d_hidden}});
  plan.fc1_backward_weights = b.step(kFc1BackwardWeights, fc1_bw_pd,
                                     {{DNNL_ARG_SRC, flat}, {DNNL_ARG_DIFF_DST, d_hidden},
                                      {DNNL_ARG_DIFF_WEIGHTS, view(4, grads)}, {DNNL_ARG_DIFF_BIAS, view(5, grads)}});
  plan.fc1_backward_data = b.step(kFc1BackwardData, fc1_bd_pd,
                                  {{DNNL_ARG_DIFF_DST, d_hidden}, {DNNL_ARG_WEIGHTS, view(4, params)},
                                   {DNNL_ARG_DIFF_SRC, d_flat}});
}

}  // namespace

std::unique_ptr<Plan> build_plan(const dnnl::engine& engine, std::uint32_t batch, Isa isa, const Buffers& buf,
                                 float* params, float* grads) {
  auto plan = std::make_unique<Plan>();
  plan->batch = batch;
  PlanBuilder b(engine, *plan);
  const std::string own = std::string("own:") + isa_name(isa);
  for (Op op : {kInputOp, kConv1Forward, kPoolForward, kDropout1Forward, kDropout2Forward, kLossOp, kDropout2Backward,
                kDropout1Backward, kPoolBackward, kConv1BackwardWeights, kSgdOp})
    plan->impl[op] = own;
  add_conv2_forward(b, *plan, buf, isa, params);
  plan->conv2_backward = std::make_unique<Conv2WinogradBackward>(engine, batch, isa);
  plan->impl[kConv2Backward] = plan->conv2_backward->impl();
  add_fc(b, *plan, buf, params, grads);
  return plan;
}

void run(const Step& step, const dnnl::stream& stream) {
  const dnnl_status_t status = dnnl_primitive_execute(step.primitive.get(), stream.get(),
                                                      static_cast<int>(step.args.size()), step.args.data());
  if (status != dnnl_success)
    throw RuntimeFailure(std::string("oneDNN: ") + (step.op < kOpCount ? kOpNames[step.op] : "primitive") +
                         " failed with status " + std::to_string(status));
}

void run(const std::vector<Step>& steps, const dnnl::stream& stream) {
  for (const Step& s : steps) run(s, stream);
}

}  // namespace mnist_mt::cpu
