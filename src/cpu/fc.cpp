// fc1 and fc2, forward and backward: oneDNN's inner products, but for fc1's passes where
// ours are faster.
#include "fc.hpp"

#include "isa.hpp"
#include "kernels.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {

// Measured per pass in the step (docs/benchmarks.md, "fc1's backward on AVX2"): at AVX2
// ours take 0.91-1.02 ms against oneDNN's 1.55-1.61 for the weights at batch 32 and
// 1.27-1.31 against 1.57-1.64 for the data, 1.8-2.0 against 3.0-3.1 and 2.1-2.4 against
// 3.0-3.2 at 64, 7.9-8.2 against 11.9-12.4 and 8.7-8.8 against 10.8-11.3 at 256; at batch 16
// and below oneDNN's pair is as fast or faster, and so it is at every batch on AVX-512
// (there our data pass is the slower one).
bool own_fc1_backward(Isa isa, std::uint32_t batch) { return isa == Isa::kAvx2 && batch >= 32; }

// Measured in training, one rank, forward ms per step (medians of 3 alternating runs,
// docs/benchmarks.md, "Small batches"): at AVX2 ours saves 0.13 ms at batch 2 and 0.14 at
// 4, nothing at 1 or 8 (3 not measured); on AVX-512 the two are as fast.
bool own_fc1_forward(Isa isa, std::uint32_t batch) { return isa == Isa::kAvx2 && batch >= 2 && batch <= 4; }

void fc1_forward(const Plan& plan, const Buffers& buf, const float* params, const dnnl::stream& stream) {
  if (plan.own_fc1_forward)
    fc1_forward(buf.flat.get(), params + kParams[4].offset, params + kParams[5].offset, plan.batch, buf.hidden.get());
  else
    run(plan.fc1, stream);
}

void fc1_backward_weights(const Plan& plan, const Buffers& buf, float* grads, const dnnl::stream& stream) {
  if (plan.own_fc1_backward)
    fc1_backward_weights(buf.d_hidden.get(), buf.flat.get(), plan.batch, grads + kParams[4].offset,
                         grads + kParams[5].offset);
  else
    run(plan.fc1_backward_weights, stream);
}

void fc1_backward_data(const Plan& plan, const Buffers& buf, const float* params, const dnnl::stream& stream) {
  if (plan.own_fc1_backward)
    fc1_backward_data(buf.d_hidden.get(), params + kParams[4].offset, plan.batch, buf.d_hidden_t.get(),
                      buf.d_flat.get());
  else
    run(plan.fc1_backward_data, stream);
}

// fc1 (ReLU fused) and fc2 through oneDNN's inner products (fc1's forward ours where
// own_fc1_forward, its backward passes where own_fc1_backward), on PyTorch's flatten
// order: the pooled map nchw seen as [n, 9216].
// With buf.bf16(), every product reads bfloat16 copies of its two operands, made by a
// reorder (round to nearest even) at the start of the pass that reads them first, and
// writes float32; the bias stays float32 (oneDNN's bf16 inner products on AVX512_BF16 or AMX).
void add_fc(PlanBuilder& b, Plan& plan, const Buffers& buf, Isa isa, float* params, float* grads) {
  using namespace dnnl;
  const bool bf16 = buf.bf16();
  if (bf16 && !bf16_products()) throw RuntimeFailure("bf16 products: " + no_bf16_products());
  const Dim n = plan.batch;
  const std::size_t cap = buf.max_batch;
  const memory::data_type operand = bf16 ? memory::data_type::bf16 : kF32;  // what the products read
  const memory::desc flat_md({n, Dim{kFlat}}, kF32, Tag::nc), hidden_md({n, Dim{kHidden}}, kF32, Tag::nc);
  const memory::desc logits_md({n, Dim{kClasses}}, kF32, Tag::nc);
  const memory::desc flat_in({n, Dim{kFlat}}, operand, Tag::nc), hidden_in({n, Dim{kHidden}}, operand, Tag::nc);
  const memory::desc logits_in({n, Dim{kClasses}}, operand, Tag::nc);
  const auto desc = [](int i) { return plain(kParams[i]); };
  const auto weights_in = [&](int i) {
    return memory::desc({Dim{kParams[i].shape[0]}, Dim{kParams[i].shape[1]}}, operand, Tag::oi);
  };
  const auto fc1_pd = planned(kFc1Forward, [&] {
    return inner_product_forward::primitive_desc(
        inner_product_forward::desc(prop_kind::forward_training, flat_in, weights_in(4), desc(5), hidden_md),
        b.relu_attr(), b.engine());
  });
  const auto fc2_pd = planned(kFc2Forward, [&] {
    return inner_product_forward::primitive_desc(
        inner_product_forward::desc(prop_kind::forward_training, hidden_in, weights_in(6), desc(7), logits_md),
        b.engine());
  });
  const memory flat = b.bind(flat_md, buf.flat, cap * kFlat), d_flat = b.bind(flat_md, buf.d_flat, cap * kFlat);
  const memory hidden = b.bind(hidden_md, buf.hidden, cap * kHidden);
  const memory d_hidden = b.bind(hidden_md, buf.d_hidden, cap * kHidden);
  const memory logits = b.bind(logits_md, buf.logits, cap * kClasses);
  const memory dlogits = b.bind(logits_md, buf.dlogits, cap * kClasses);
  const auto view = [&](int i, float* base) { return b.view(kParams[i], base); };
  // What a product reads of `from` (float32): `from` itself, or with bf16 its copy in
  // `to`, converted by a reorder appended to `steps`.
  const auto operand_of = [&](Op op, const memory& from, const memory::desc& to_md, void* to, std::size_t to_count,
                              std::vector<Step>& steps) {
    if (!bf16) return from;
    const memory copy = b.bind(to_md, to, to_count * sizeof(std::uint16_t));
    const auto pd = planned(op, [&] { return reorder::primitive_desc(b.engine(), from.get_desc(), b.engine(), to_md); });
    steps.push_back(b.step(op, pd, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, copy}}, "reorder "));
    return copy;
  };
  const memory flat_x = operand_of(kFc1Forward, flat, flat_in, buf.flat16.get(), cap * kFlat, plan.fc1);
  const memory w1 = operand_of(kFc1Forward, view(4, params), weights_in(4), buf.fc1_weights16.get(),
                               kParams[4].count, plan.fc1);
  plan.own_fc1_forward = !bf16 && own_fc1_forward(isa, plan.batch);
  if (plan.own_fc1_forward)
    plan.impl[kFc1Forward] = std::string("own:") + isa_name(isa);
  else
    plan.fc1.push_back(b.step(kFc1Forward, fc1_pd, {{DNNL_ARG_SRC, flat_x}, {DNNL_ARG_WEIGHTS, w1},
                                                    {DNNL_ARG_BIAS, view(5, params)}, {DNNL_ARG_DST, hidden}}));
  const memory hidden_x = operand_of(kFc2Forward, hidden, hidden_in, buf.hidden16.get(), cap * kHidden, plan.fc2);
  const memory w2 = operand_of(kFc2Forward, view(6, params), weights_in(6), buf.fc2_weights16.get(),
                               kParams[6].count, plan.fc2);
  plan.fc2.push_back(b.step(kFc2Forward, fc2_pd, {{DNNL_ARG_SRC, hidden_x}, {DNNL_ARG_WEIGHTS, w2},
                                                  {DNNL_ARG_BIAS, view(7, params)}, {DNNL_ARG_DST, logits}}));
  // An inner product's two backward passes, from its input `in` (gradient into `d_in`),
  // output gradient `d_out` (float32; the weights pass first makes its bf16 copy `d_out16`,
  // which the data pass reads: the replica runs the weights pass first, and skips fc1's
  // only with --exchange factors, which bf16 refuses) and weights `w_in` as the forward
  // pass reads them, its parameters `w` and w + 1.
  const auto add_backward = [&](Op weights_op, Op data_op, const inner_product_forward::primitive_desc& fwd,
                                const memory& in, const memory& d_in, const memory& d_out, void* d_out16,
                                std::size_t d_out_width, const memory& w_in, int w, std::vector<Step>& weights,
                                std::vector<Step>& data) {
    const memory::desc& in_md = in.get_desc();
    const memory::desc out_in({n, Dim(d_out_width)}, operand, Tag::nc);
    const auto weights_pd = planned(weights_op, [&] {
      return inner_product_backward_weights::primitive_desc(
          inner_product_backward_weights::desc(in_md, desc(w), desc(w + 1), out_in), b.engine(), fwd);
    });
    const auto data_pd = planned(data_op, [&] {
      return inner_product_backward_data::primitive_desc(
          inner_product_backward_data::desc(d_in.get_desc(), w_in.get_desc(), out_in), b.engine(), fwd);
    });
    const memory d_out_x = operand_of(weights_op, d_out, out_in, d_out16, cap * d_out_width, weights);
    weights.push_back(b.step(weights_op, weights_pd,
                             {{DNNL_ARG_SRC, in}, {DNNL_ARG_DIFF_DST, d_out_x}, {DNNL_ARG_DIFF_WEIGHTS, view(w, grads)},
                              {DNNL_ARG_DIFF_BIAS, view(w + 1, grads)}}));
    data.push_back(
        b.step(data_op, data_pd, {{DNNL_ARG_DIFF_DST, d_out_x}, {DNNL_ARG_WEIGHTS, w_in}, {DNNL_ARG_DIFF_SRC, d_in}}));
  };
  add_backward(kFc2BackwardWeights, kFc2BackwardData, fc2_pd, hidden_x, d_hidden, dlogits, buf.dlogits16.get(),
               kClasses, w2, 6, plan.fc2_backward_weights, plan.fc2_backward_data);
  plan.own_fc1_backward = !bf16 && own_fc1_backward(isa, plan.batch);
  if (plan.own_fc1_backward)
    plan.impl[kFc1BackwardWeights] = plan.impl[kFc1BackwardData] = std::string("own:") + isa_name(isa);
  else
    add_backward(kFc1BackwardWeights, kFc1BackwardData, fc1_pd, flat_x, d_flat, d_hidden, buf.d_hidden16.get(),
                 kHidden, w1, 4, plan.fc1_backward_weights, plan.fc1_backward_data);
}

}  // namespace mnist_mt::cpu
