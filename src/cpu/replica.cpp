// The oneDNN replica. Activations stay in the layouts oneDNN picks (blocked nChw16c on
// AVX-512) from conv1 to the pooling; one reorder turns the pooled map into PyTorch's
// flatten order for fc1, and dropout runs on that plain copy. Parameters, gradients and
// momentum are flat buffers in state-dict order; only the small conv weights are reordered.
#include "replica.hpp"

#include <algorithm>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "kernels.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr auto kF32 = memory::data_type::f32;

constexpr std::int64_t kConv1Side = 26, kConv2Side = 24, kPoolSide = 12;
constexpr std::int64_t kConv1Channels = 32, kConv2Channels = 64, kHidden = 128;
constexpr std::int64_t kFlat = kConv2Channels * kPoolSide * kPoolSide;  // 9216

struct AlignedFree {
  void operator()(void* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
// A zeroed, 64-byte aligned array: cache-line aligned for oneDNN and our loops.
template <class T>
using Aligned = std::unique_ptr<T[], AlignedFree>;
template <class T>
Aligned<T> aligned_zeros(std::size_t count) {
  void* p = ::operator new[](std::max<std::size_t>(count, 1) * sizeof(T), std::align_val_t{64});
  std::memset(p, 0, std::max<std::size_t>(count, 1) * sizeof(T));
  return Aligned<T>(static_cast<T*>(p));
}

// Activation buffers, sized for max_batch and shared by the plans of every batch size.
struct Buffers {
  explicit Buffers(std::size_t b)
      : max_batch(b),
        input(aligned_zeros<float>(b * kImageBytes)),
        act1(aligned_zeros<float>(b * kConv1Channels * kConv1Side * kConv1Side)),
        d_act1(aligned_zeros<float>(b * kConv1Channels * kConv1Side * kConv1Side)),
        act2(aligned_zeros<float>(b * kConv2Channels * kConv2Side * kConv2Side)),
        d_act2(aligned_zeros<float>(b * kConv2Channels * kConv2Side * kConv2Side)),
        pooled(aligned_zeros<float>(b * kFlat)),
        d_pooled(aligned_zeros<float>(b * kFlat)),
        workspace(aligned_zeros<std::uint8_t>(b * kFlat * sizeof(std::int32_t))),
        flat(aligned_zeros<float>(b * kFlat)),
        d_flat(aligned_zeros<float>(b * kFlat)),
        hidden(aligned_zeros<float>(b * kHidden)),
        d_hidden(aligned_zeros<float>(b * kHidden)),
        logits(aligned_zeros<float>(b * kClasses)),
        logp(aligned_zeros<float>(b * kClasses)),
        dlogits(aligned_zeros<float>(b * kClasses)),
        labels(aligned_zeros<std::uint8_t>(b)),
        samples(aligned_zeros<std::uint32_t>(b)) {}

  std::size_t max_batch;
  Aligned<float> input, act1, d_act1, act2, d_act2, pooled, d_pooled;
  Aligned<std::uint8_t> workspace;  // max pooling's argmax, at most 4 bytes an output
  Aligned<float> flat, d_flat, hidden, d_hidden, logits, logp, dlogits;
  Aligned<std::uint8_t> labels;
  Aligned<std::uint32_t> samples;
};

// A primitive with its arguments, run through the C API so a step allocates nothing.
struct Step {
  dnnl::primitive primitive;
  std::vector<dnnl_exec_arg_t> args;
};

// Every primitive for one batch size, bound to the replica's buffers.
struct Plan {
  std::uint32_t batch = 0;
  std::vector<memory> memories;     // keeps the memory objects behind Step::args alive
  std::vector<Aligned<float>> owned;  // conv weights in oneDNN's layouts
  std::vector<Step> weights_to_forward;  // conv weights: state-dict layout -> forward layouts
  Step conv1, conv2, pool, flatten, fc1, fc2;
  Step fc2_backward_weights;
  Step fc2_backward_data, fc1_backward_weights;
  Step fc1_backward_data, unflatten, pool_backward, conv2_backward_weights;
  std::vector<Step> conv2_grads_out;  // conv2 weight gradients -> state-dict layout
  std::vector<Step> weights_to_backward;
  Step conv2_backward_data, relu1_backward, conv1_backward_weights;
  std::vector<Step> conv1_grads_out;
};

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

  template <class Pd>
  Step step(const Pd& pd, std::initializer_list<std::pair<int, memory>> args) {
    Step s{dnnl::primitive(pd.get()), {}};
    for (const auto& [arg, mem] : args) s.args.push_back({arg, mem.get()});
    return s;
  }

  // `user` itself when `wanted` is its layout; otherwise a buffer of the plan in the
  // wanted layout, and in `steps` a reorder between the two (user -> buffer when
  // `into_wanted`, else buffer -> user).
  memory bridge(const memory& user, const memory::desc& wanted, bool into_wanted, std::vector<Step>& steps) {
    if (wanted == user.get_desc()) return user;
    auto& owned = plan_.owned.emplace_back(aligned_zeros<float>(wanted.get_size() / sizeof(float)));
    const memory buffer = plan_.memories.emplace_back(wanted, engine_, owned.get());
    const memory& from = into_wanted ? user : buffer;
    const memory& to = into_wanted ? buffer : user;
    steps.push_back(step(dnnl::reorder::primitive_desc(engine_, from.get_desc(), engine_, to.get_desc()),
                         {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}));
    return buffer;
  }

 private:
  const dnnl::engine& engine_;
  Plan& plan_;
  dnnl::primitive_attr relu_attr_;
};

std::unique_ptr<Plan> build_plan(const dnnl::engine& engine, std::uint32_t batch, const Buffers& buf, float* params,
                                 float* grads) {
  using namespace dnnl;
  auto plan = std::make_unique<Plan>();
  plan->batch = batch;
  PlanBuilder b(engine, *plan);
  const memory::dim n = batch;
  const std::size_t cap = buf.max_batch;
  const memory::dims unit{1, 1}, zero{0, 0}, two{2, 2};
  const auto desc = [](const ParamInfo& p) { return plain(p); };
  const auto view = [&](int i, float* base) {
    return b.bind(desc(kParams[i]), base + kParams[i].offset, kParams[i].count * sizeof(float));
  };
  const memory::desc any_w1({kConv1Channels, 1, 3, 3}, kF32, Tag::any);
  const memory::desc any_w2({kConv2Channels, kConv1Channels, 3, 3}, kF32, Tag::any);
  const memory::desc x_md({n, 1, kImageSide, kImageSide}, kF32, Tag::nchw);
  // fc1's input is the pooled map in PyTorch's flatten order: nchw seen as [n, 9216].
  const memory::desc flat_md({n, kFlat}, kF32, Tag::nc), hidden_md({n, kHidden}, kF32, Tag::nc);
  const memory::desc flat_nchw_md({n, kConv2Channels, kPoolSide, kPoolSide}, kF32, Tag::nchw);
  const memory::desc logits_md({n, kClasses}, kF32, Tag::nc);

  // Forward: conv weights and activations in whatever layout oneDNN prefers (Tag::any).
  const convolution_forward::primitive_desc conv1_pd(
      convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, x_md, any_w1,
                                desc(kParams[1]), {{n, kConv1Channels, kConv1Side, kConv1Side}, kF32, Tag::any},
                                unit, zero, zero),
      b.relu_attr(), engine);
  const memory::desc a1_md = conv1_pd.dst_desc();
  const convolution_forward::primitive_desc conv2_pd(
      convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_auto, a1_md, any_w2,
                                desc(kParams[3]), {{n, kConv2Channels, kConv2Side, kConv2Side}, kF32, Tag::any},
                                unit, zero, zero),
      b.relu_attr(), engine);
  const memory::desc a2_md = conv2_pd.dst_desc();
  const pooling_forward::primitive_desc pool_pd(
      pooling_forward::desc(prop_kind::forward_training, algorithm::pooling_max, a2_md,
                            {{n, kConv2Channels, kPoolSide, kPoolSide}, kF32, Tag::any}, two, two, zero, zero),
      engine);
  const inner_product_forward::primitive_desc fc1_pd(
      inner_product_forward::desc(prop_kind::forward_training, flat_md, desc(kParams[4]), desc(kParams[5]), hidden_md),
      b.relu_attr(), engine);
  const inner_product_forward::primitive_desc fc2_pd(
      inner_product_forward::desc(prop_kind::forward_training, hidden_md, desc(kParams[6]), desc(kParams[7]), logits_md),
      engine);

  // Backward, on the forward's activation layouts.
  const inner_product_backward_weights::primitive_desc fc2_bw_pd(
      inner_product_backward_weights::desc(hidden_md, desc(kParams[6]), desc(kParams[7]), logits_md), engine, fc2_pd);
  const inner_product_backward_data::primitive_desc fc2_bd_pd(
      inner_product_backward_data::desc(hidden_md, desc(kParams[6]), logits_md), engine, fc2_pd);
  const inner_product_backward_weights::primitive_desc fc1_bw_pd(
      inner_product_backward_weights::desc(flat_md, desc(kParams[4]), desc(kParams[5]), hidden_md), engine, fc1_pd);
  const inner_product_backward_data::primitive_desc fc1_bd_pd(
      inner_product_backward_data::desc(flat_md, desc(kParams[4]), hidden_md), engine, fc1_pd);
  const pooling_backward::primitive_desc pool_bd_pd(
      pooling_backward::desc(algorithm::pooling_max, a2_md, pool_pd.dst_desc(), two, two, zero, zero), engine, pool_pd);
  const convolution_backward_weights::primitive_desc conv2_bw_pd(
      convolution_backward_weights::desc(algorithm::convolution_auto, a1_md, any_w2, desc(kParams[3]), a2_md, unit,
                                         zero, zero),
      engine, conv2_pd);
  const convolution_backward_data::primitive_desc conv2_bd_pd(
      convolution_backward_data::desc(algorithm::convolution_auto, a1_md, any_w2, a2_md, unit, zero, zero), engine,
      conv2_pd);
  const eltwise_forward::primitive_desc relu1_hint(
      eltwise_forward::desc(prop_kind::forward_training, algorithm::eltwise_relu_use_dst_for_bwd, a1_md, 0.0f), engine);
  const eltwise_backward::primitive_desc relu1_bd_pd(
      eltwise_backward::desc(algorithm::eltwise_relu_use_dst_for_bwd, a1_md, a1_md, 0.0f), engine, relu1_hint);
  const convolution_backward_weights::primitive_desc conv1_bw_pd(
      convolution_backward_weights::desc(algorithm::convolution_direct, x_md, any_w1, desc(kParams[1]), a1_md, unit,
                                         zero, zero),
      engine, conv1_pd);

  const std::size_t act1_count = cap * kConv1Channels * kConv1Side * kConv1Side;
  const std::size_t act2_count = cap * kConv2Channels * kConv2Side * kConv2Side;
  const memory x = b.bind(x_md, buf.input, cap * kImageBytes);
  const memory a1 = b.bind(a1_md, buf.act1, act1_count), d_a1 = b.bind(a1_md, buf.d_act1, act1_count);
  const memory a2 = b.bind(a2_md, buf.act2, act2_count), d_a2 = b.bind(a2_md, buf.d_act2, act2_count);
  const memory pooled = b.bind(pool_pd.dst_desc(), buf.pooled, cap * kFlat);
  const memory d_pooled = b.bind(pool_bd_pd.diff_dst_desc(), buf.d_pooled, cap * kFlat);
  const memory ws = b.bind(pool_pd.workspace_desc(), buf.workspace, cap * kFlat * sizeof(std::int32_t));
  const memory flat = b.bind(flat_md, buf.flat, cap * kFlat), d_flat = b.bind(flat_md, buf.d_flat, cap * kFlat);
  const memory hidden = b.bind(hidden_md, buf.hidden, cap * kHidden);
  const memory d_hidden = b.bind(hidden_md, buf.d_hidden, cap * kHidden);
  const memory logits = b.bind(logits_md, buf.logits, cap * kClasses);
  const memory dlogits = b.bind(logits_md, buf.dlogits, cap * kClasses);
  const memory flat_nchw = b.bind(flat_nchw_md, buf.flat, cap * kFlat);
  const memory d_flat_nchw = b.bind(flat_nchw_md, buf.d_flat, cap * kFlat);

  const memory w1 = b.bridge(view(0, params), conv1_pd.weights_desc(), true, plan->weights_to_forward);
  const memory w2 = b.bridge(view(2, params), conv2_pd.weights_desc(), true, plan->weights_to_forward);
  const memory w2_bd = b.bridge(view(2, params), conv2_bd_pd.weights_desc(), true, plan->weights_to_backward);
  const memory dw1 = b.bridge(view(0, grads), conv1_bw_pd.diff_weights_desc(), false, plan->conv1_grads_out);
  const memory dw2 = b.bridge(view(2, grads), conv2_bw_pd.diff_weights_desc(), false, plan->conv2_grads_out);

  plan->conv1 = b.step(conv1_pd, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w1}, {DNNL_ARG_BIAS, view(1, params)},
                                  {DNNL_ARG_DST, a1}});
  plan->conv2 = b.step(conv2_pd, {{DNNL_ARG_SRC, a1}, {DNNL_ARG_WEIGHTS, w2}, {DNNL_ARG_BIAS, view(3, params)},
                                  {DNNL_ARG_DST, a2}});
  plan->pool = b.step(pool_pd, {{DNNL_ARG_SRC, a2}, {DNNL_ARG_DST, pooled}, {DNNL_ARG_WORKSPACE, ws}});
  plan->flatten = b.step(dnnl::reorder::primitive_desc(engine, pool_pd.dst_desc(), engine, flat_nchw_md),
                         {{DNNL_ARG_FROM, pooled}, {DNNL_ARG_TO, flat_nchw}});
  plan->fc1 = b.step(fc1_pd, {{DNNL_ARG_SRC, flat}, {DNNL_ARG_WEIGHTS, view(4, params)},
                              {DNNL_ARG_BIAS, view(5, params)}, {DNNL_ARG_DST, hidden}});
  plan->fc2 = b.step(fc2_pd, {{DNNL_ARG_SRC, hidden}, {DNNL_ARG_WEIGHTS, view(6, params)},
                              {DNNL_ARG_BIAS, view(7, params)}, {DNNL_ARG_DST, logits}});

  plan->fc2_backward_weights = b.step(fc2_bw_pd, {{DNNL_ARG_SRC, hidden}, {DNNL_ARG_DIFF_DST, dlogits},
                                                  {DNNL_ARG_DIFF_WEIGHTS, view(6, grads)},
                                                  {DNNL_ARG_DIFF_BIAS, view(7, grads)}});
  plan->fc2_backward_data = b.step(fc2_bd_pd, {{DNNL_ARG_DIFF_DST, dlogits}, {DNNL_ARG_WEIGHTS, view(6, params)},
                                               {DNNL_ARG_DIFF_SRC, d_hidden}});
  plan->fc1_backward_weights = b.step(fc1_bw_pd, {{DNNL_ARG_SRC, flat}, {DNNL_ARG_DIFF_DST, d_hidden},
                                                  {DNNL_ARG_DIFF_WEIGHTS, view(4, grads)},
                                                  {DNNL_ARG_DIFF_BIAS, view(5, grads)}});
  plan->fc1_backward_data = b.step(fc1_bd_pd, {{DNNL_ARG_DIFF_DST, d_hidden}, {DNNL_ARG_WEIGHTS, view(4, params)},
                                               {DNNL_ARG_DIFF_SRC, d_flat}});
  plan->unflatten = b.step(dnnl::reorder::primitive_desc(engine, flat_nchw_md, engine, pool_bd_pd.diff_dst_desc()),
                           {{DNNL_ARG_FROM, d_flat_nchw}, {DNNL_ARG_TO, d_pooled}});
  plan->pool_backward = b.step(pool_bd_pd, {{DNNL_ARG_DIFF_DST, d_pooled}, {DNNL_ARG_WORKSPACE, ws},
                                            {DNNL_ARG_DIFF_SRC, d_a2}});
  plan->conv2_backward_weights = b.step(conv2_bw_pd, {{DNNL_ARG_SRC, a1}, {DNNL_ARG_DIFF_DST, d_a2},
                                                      {DNNL_ARG_DIFF_WEIGHTS, dw2},
                                                      {DNNL_ARG_DIFF_BIAS, view(3, grads)}});
  plan->conv2_backward_data = b.step(conv2_bd_pd, {{DNNL_ARG_DIFF_DST, d_a2}, {DNNL_ARG_WEIGHTS, w2_bd},
                                                   {DNNL_ARG_DIFF_SRC, d_a1}});
  plan->relu1_backward = b.step(relu1_bd_pd, {{DNNL_ARG_DST, a1}, {DNNL_ARG_DIFF_DST, d_a1}, {DNNL_ARG_DIFF_SRC, d_a1}});
  plan->conv1_backward_weights = b.step(conv1_bw_pd, {{DNNL_ARG_SRC, x}, {DNNL_ARG_DIFF_DST, d_a1},
                                                      {DNNL_ARG_DIFF_WEIGHTS, dw1},
                                                      {DNNL_ARG_DIFF_BIAS, view(1, grads)}});
  return plan;
}

void run(const Step& step, const dnnl::stream& stream) {
  const dnnl_status_t status = dnnl_primitive_execute(step.primitive.get(), stream.get(),
                                                      static_cast<int>(step.args.size()), step.args.data());
  if (status != dnnl_success) throw RuntimeFailure("oneDNN primitive failed with status " + std::to_string(status));
}

void run(const std::vector<Step>& steps, const dnnl::stream& stream) {
  for (const Step& s : steps) run(s, stream);
}

class CpuReplica final : public Replica {
 public:
  CpuReplica(CpuDevice& device, std::uint32_t max_batch)
      : device_(device),
        max_batch_(max_batch),
        params_(aligned_zeros<float>(kParamCount)),
        grads_(aligned_zeros<float>(kParamCount)),
        momentum_(aligned_zeros<float>(kParamCount)),
        buffers_(max_batch),
        staged_images_(std::size_t{max_batch} * kImageBytes),
        staged_labels_(max_batch),
        staged_samples_(max_batch) {
    if (max_batch == 0) throw RuntimeFailure(device.name() + ": replica needs max_batch > 0");
    run_sync([this] {
      engine_ = dnnl::engine(dnnl::engine::kind::cpu, 0);
      stream_ = dnnl::stream(engine_);
    });
    plan_for(max_batch);
  }

  ~CpuReplica() override {
    // Tasks still queued refer to this replica: drain them (their errors went elsewhere).
    // oneDNN objects die on the thread that made them: its scratchpad is counted per thread.
    Stream& compute = device_.compute();
    compute.wait_quiet(compute.enqueue(
        [this] {
          plans_.clear();
          stream_ = dnnl::stream();
          engine_ = dnnl::engine();
        },
        true));
  }

  std::uint32_t max_batch() const override { return max_batch_; }
  float* params() override { return params_.get(); }
  float* grads() override { return grads_.get(); }

  void set_input(const Batch& batch) override {
    if (batch.size == 0 || batch.size > max_batch_ || batch.images.size() < std::size_t{batch.size} * kImageBytes ||
        batch.labels.size() < batch.size || batch.indices.size() < batch.size)
      throw RuntimeFailure(device_.name() + ": batch of " + std::to_string(batch.size) + " samples, replica holds 1.." +
                           std::to_string(max_batch_) + " (or the batch's buffers are short)");
    Plan* plan = &plan_for(batch.size);
    // The staging copy is free again once the previous input's copy task has run.
    device_.compute().wait(staged_ticket_);
    std::memcpy(staged_images_.data(), batch.images.data(), std::size_t{batch.size} * kImageBytes);
    std::memcpy(staged_labels_.data(), batch.labels.data(), batch.size);
    std::memcpy(staged_samples_.data(), batch.indices.data(), batch.size * sizeof(std::uint32_t));
    staged_ticket_ = device_.compute().enqueue([this, plan] {
      normalise_images(staged_images_.data(), std::size_t{plan->batch} * kImageBytes, buffers_.input.get());
      std::memcpy(buffers_.labels.get(), staged_labels_.data(), plan->batch);
      std::memcpy(buffers_.samples.get(), staged_samples_.data(), plan->batch * sizeof(std::uint32_t));
    });
    plan_ = plan;
  }

  void forward(bool train, const DropoutKey& key, std::uint32_t loss_denominator) override {
    Plan* plan = current_plan();
    if (loss_denominator == 0) throw RuntimeFailure(device_.name() + ": forward with loss_denominator 0");
    device_.compute().enqueue([this, plan, train, key, loss_denominator] {
      run_forward(*plan, train, key, static_cast<float>(loss_denominator));
    });
  }

  void backward(const std::function<void(int layer)>& grads_ready) override {
    Plan* plan = current_plan();
    Stream& compute = device_.compute();
    compute.enqueue([this, plan] { run(plan->fc2_backward_weights, stream_); });
    grads_ready(kFc2);
    compute.enqueue([this, plan] {
      run(plan->fc2_backward_data, stream_);
      relu_dropout_backward(buffers_.hidden.get(), scale1_, std::size_t{plan->batch} * kHidden, buffers_.d_hidden.get());
      run(plan->fc1_backward_weights, stream_);
    });
    grads_ready(kFc1);
    compute.enqueue([this, plan] {
      run(plan->fc1_backward_data, stream_);
      relu_dropout_backward(buffers_.flat.get(), scale0_, std::size_t{plan->batch} * kFlat, buffers_.d_flat.get());
      run(plan->unflatten, stream_);
      run(plan->pool_backward, stream_);
      run(plan->conv2_backward_weights, stream_);
      run(plan->conv2_grads_out, stream_);
    });
    grads_ready(kConv2);
    compute.enqueue([this, plan] {
      run(plan->weights_to_backward, stream_);
      run(plan->conv2_backward_data, stream_);
      run(plan->relu1_backward, stream_);
      run(plan->conv1_backward_weights, stream_);
      run(plan->conv1_grads_out, stream_);
    });
    grads_ready(kConv1);
  }

  void sgd_step(const SgdOptions& options) override {
    device_.compute().enqueue([this, options] {
      sgd_update(params_.get(), grads_.get(), momentum_.get(), kParamCount, options, !momentum_valid_);
      momentum_valid_ = true;
    });
  }

  void read_params(std::span<float> out) override { copy_out(params_.get(), out); }
  void write_params(std::span<const float> in) override { copy_in(in, params_.get()); }
  void read_momentum(std::span<float> out) override { copy_out(momentum_.get(), out); }
  void write_momentum(std::span<const float> in) override {
    check_size(in.size());
    run_sync([&] {
      std::memcpy(momentum_.get(), in.data(), kParamCount * sizeof(float));
      momentum_valid_ = true;
    });
  }
  void read_grads(std::span<float> out) override { copy_out(grads_.get(), out); }

  void read_logprobs(std::span<float> out) override {
    const std::size_t count = std::size_t{current_plan()->batch} * kClasses;
    if (out.size() != count)
      throw RuntimeFailure("read_logprobs: " + std::to_string(out.size()) + " floats, the batch has " +
                           std::to_string(count));
    run_sync([&] { std::memcpy(out.data(), buffers_.logp.get(), count * sizeof(float)); });
  }

  StepStats take_stats() override {
    StepStats stats;
    run_sync([&] {
      stats = {sums_.loss, sums_.correct, samples_};
      sums_ = {};
      samples_ = 0;
    });
    return stats;
  }

 private:
  Plan* current_plan() const {
    if (plan_ == nullptr) throw RuntimeFailure(device_.name() + ": replica used before set_input");
    return plan_;
  }

  // Plans are built on the compute thread: oneDNN picks its kernels for the thread count
  // of the thread that creates them.
  Plan& plan_for(std::uint32_t batch) {
    auto it = plans_.find(batch);
    if (it != plans_.end()) return *it->second;
    std::unique_ptr<Plan> plan;
    run_sync([&] {
      try {
        plan = build_plan(engine_, batch, buffers_, params_.get(), grads_.get());
      } catch (const dnnl::error& e) {
        throw RuntimeFailure(device_.name() + ": oneDNN: " + e.what());
      }
    });
    return *plans_.emplace(batch, std::move(plan)).first->second;
  }

  template <class F>
  void run_sync(F&& task) {
    Stream& compute = device_.compute();
    compute.wait(compute.enqueue(std::forward<F>(task)));
  }

  void copy_out(const float* from, std::span<float> out) {
    check_size(out.size());
    run_sync([&] { std::memcpy(out.data(), from, kParamCount * sizeof(float)); });
  }
  void copy_in(std::span<const float> in, float* to) {
    check_size(in.size());
    run_sync([&] { std::memcpy(to, in.data(), kParamCount * sizeof(float)); });
  }
  void check_size(std::size_t count) const {
    if (count != kParamCount)
      throw RuntimeFailure(device_.name() + ": parameter copy of " + std::to_string(count) + " floats, expected " +
                           std::to_string(kParamCount));
  }

  void run_forward(const Plan& plan, bool train, const DropoutKey& key, float loss_denominator) {
    const std::uint32_t n = plan.batch;
    run(plan.weights_to_forward, stream_);
    run(plan.conv1, stream_);
    run(plan.conv2, stream_);
    run(plan.pool, stream_);
    run(plan.flatten, stream_);
    scale0_ = train ? 1.0f / (1.0f - kDropout1) : 1.0f;
    if (train) dropout_forward(key, buffers_.samples.get(), n, RandomStream::kDropout0, kFlat, kDropout1, buffers_.flat.get());
    run(plan.fc1, stream_);
    scale1_ = train ? 1.0f / (1.0f - kDropout2) : 1.0f;
    if (train)
      dropout_forward(key, buffers_.samples.get(), n, RandomStream::kDropout1, kHidden, kDropout2, buffers_.hidden.get());
    run(plan.fc2, stream_);
    stream_.wait();
    log_softmax_nll(buffers_.logits.get(), buffers_.labels.get(), n, loss_denominator, buffers_.logp.get(),
                    buffers_.dlogits.get(), sums_);
    samples_ += n;
  }

  CpuDevice& device_;
  const std::uint32_t max_batch_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  Aligned<float> params_, grads_, momentum_;
  Buffers buffers_;
  std::map<std::uint32_t, std::unique_ptr<Plan>> plans_;

  // Host side: the current input's plan, and the staging copy of the batch.
  Plan* plan_ = nullptr;
  std::vector<std::uint8_t> staged_images_, staged_labels_;
  std::vector<std::uint32_t> staged_samples_;
  std::uint64_t staged_ticket_ = 0;

  // Compute-stream side.
  bool momentum_valid_ = false;  // false until the first step: buf = g then
  float scale0_ = 1.0f, scale1_ = 1.0f;  // dropout scales of the last forward
  LossSums sums_;
  double samples_ = 0;
};

}  // namespace

std::unique_ptr<Replica> make_cpu_replica(CpuDevice& device, std::uint32_t max_batch) {
  return std::make_unique<CpuReplica>(device, max_batch);
}

}  // namespace mnist_mt::cpu
