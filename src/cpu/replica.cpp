// The CPU replica: conv2 and the fully-connected layers through oneDNN, conv1 and the
// ReLU + max pooling through own kernels (conv1.hpp, pool.hpp). Activations from conv1 to
// the pooling are in oneDNN's blocked layout for the ISA (nChw16c on AVX-512, nChw8c
// otherwise); the pooling writes PyTorch's flatten order for fc1, and dropout runs on
// that. Parameters, gradients and momentum are flat buffers in state-dict order; only
// conv2's weights are reordered.
#include "replica.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "conv1.hpp"
#include "conv2_winograd.hpp"
#include "kernels.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "pool.hpp"

namespace mnist_mt::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr auto kF32 = memory::data_type::f32;

using Dim = memory::dim;

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
        argmax(aligned_zeros<std::uint8_t>(b * kFlat)),
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
  Aligned<float> input, act1, d_act1, act2, d_act2;
  Aligned<std::uint8_t> argmax;  // the pooling's, one byte an output
  Aligned<float> flat, d_flat, hidden, d_hidden, logits, logp, dlogits;
  Aligned<std::uint8_t> labels;
  Aligned<std::uint32_t> samples;
};

// The operations of a step, in order; each is timed (take_profile) and has one entry in a
// plan's kernel list. Weight reorders are part of the convolution pass they serve.
enum Op : int {
  kInputOp, kConv1Forward, kConv2Forward, kPoolForward, kDropout1Forward, kFc1Forward, kDropout2Forward,
  kFc2Forward, kLossOp, kFc2BackwardWeights, kFc2BackwardData, kDropout2Backward, kFc1BackwardWeights,
  kFc1BackwardData, kDropout1Backward, kPoolBackward, kConv2Backward, kConv1BackwardWeights, kSgdOp, kOpCount
};
constexpr std::array<const char*, kOpCount> kOpNames{
    "input (normalise)",     "conv1 forward (+ReLU)",      "conv2 forward",          "ReLU + pool forward",
    "dropout1 forward",      "fc1 forward (+ReLU)",        "dropout2 forward",       "fc2 forward",
    "log_softmax + NLL",     "fc2 backward_weights",       "fc2 backward_data",      "dropout2 + ReLU backward",
    "fc1 backward_weights",  "fc1 backward_data",          "dropout1 backward",      "ReLU + pool backward",
    "conv2 backward (weights + data)", "ReLU + conv1 backward_weights", "SGD"};

// A primitive with its arguments, run through the C API so a step allocates nothing.
struct Step {
  dnnl::primitive primitive;
  std::vector<dnnl_exec_arg_t> args;
};

// Every primitive for one batch size, bound to the replica's buffers.
struct Plan {
  std::uint32_t batch = 0;
  std::vector<memory> memories;     // keeps the memory objects behind Step::args alive
  std::vector<Aligned<float>> owned;  // conv2's weights in oneDNN's layouts
  std::vector<Step> weights_to_forward;  // conv2's weights: state-dict layout -> forward layout
  Step conv2, fc1, fc2;
  Step fc2_backward_weights, fc2_backward_data, fc1_backward_weights, fc1_backward_data;
  std::unique_ptr<Conv2WinogradBackward> conv2_backward;
  std::array<std::string, kOpCount> impl;  // what runs each operation: oneDNN's implementation or ours
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
  // A parameter (or its gradient) in its state-dict layout, inside the flat buffer at `base`.
  memory view(const ParamInfo& p, float* base) { return bind(plain(p), base + p.offset, p.count * sizeof(float)); }

  // A primitive bound to its arguments, recorded as (part of) operation `op`.
  template <class Pd>
  Step step(Op op, const Pd& pd, std::initializer_list<std::pair<int, memory>> args, const char* what = "") {
    std::string& impl = plan_.impl[op];
    impl += (impl.empty() ? "" : " + ") + std::string(what) + pd.impl_info_str();
    Step s{dnnl::primitive(pd.get()), {}};
    for (const auto& [arg, mem] : args) s.args.push_back({arg, mem.get()});
    return s;
  }

  // `user` itself when `wanted` is its layout; otherwise a buffer of the plan in the
  // wanted layout, and in `steps` a reorder between the two (user -> buffer when
  // `into_wanted`, else buffer -> user).
  memory bridge(Op op, const memory& user, const memory::desc& wanted, bool into_wanted,
                std::vector<Step>& steps) {
    if (wanted == user.get_desc()) return user;
    auto& owned = plan_.owned.emplace_back(aligned_zeros<float>(wanted.get_size() / sizeof(float)));
    const memory buffer = plan_.memories.emplace_back(wanted, engine_, owned.get());
    const memory& from = into_wanted ? user : buffer;
    const memory& to = into_wanted ? buffer : user;
    steps.push_back(step(op, dnnl::reorder::primitive_desc(engine_, from.get_desc(), engine_, to.get_desc()),
                         {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}, "reorder "));
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
  const memory w2 = b.bridge(kConv2Forward, view(2, params), fwd.weights_desc(), true, plan.weights_to_forward);
  plan.conv2 = b.step(kConv2Forward, fwd,
                      {{DNNL_ARG_SRC, a1}, {DNNL_ARG_WEIGHTS, w2}, {DNNL_ARG_BIAS, view(3, params)}, {DNNL_ARG_DST, a2}});
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
  if (status != dnnl_success) throw RuntimeFailure("oneDNN primitive failed with status " + std::to_string(status));
}

void run(const std::vector<Step>& steps, const dnnl::stream& stream) {
  for (const Step& s : steps) run(s, stream);
}

class CpuReplicaImpl final : public CpuReplica {
 public:
  CpuReplicaImpl(CpuDevice& device, std::uint32_t max_batch)
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

  ~CpuReplicaImpl() override {
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
      timed(kInputOp, [&] {
        normalise_images(staged_images_.data(), std::size_t{plan->batch} * kImageBytes, buffers_.input.get());
        std::memcpy(buffers_.labels.get(), staged_labels_.data(), plan->batch);
        std::memcpy(buffers_.samples.get(), staged_samples_.data(), plan->batch * sizeof(std::uint32_t));
      });
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
    compute.enqueue([this, plan] { timed(kFc2BackwardWeights, [&] { run(plan->fc2_backward_weights, stream_); }); });
    grads_ready(kFc2);
    compute.enqueue([this, plan] {
      const std::size_t n = plan->batch;
      timed(kFc2BackwardData, [&] { run(plan->fc2_backward_data, stream_); });
      timed(kDropout2Backward,
            [&] { relu_dropout_backward(buffers_.hidden.get(), scale1_, n * kHidden, buffers_.d_hidden.get()); });
      timed(kFc1BackwardWeights, [&] { run(plan->fc1_backward_weights, stream_); });
    });
    grads_ready(kFc1);
    compute.enqueue([this, plan] {
      const std::size_t n = plan->batch;
      timed(kFc1BackwardData, [&] { run(plan->fc1_backward_data, stream_); });
      timed(kDropout1Backward,
            [&] { relu_dropout_backward(buffers_.flat.get(), scale0_, n * kFlat, buffers_.d_flat.get()); });
      timed(kPoolBackward, [&] {
        pool_.backward(buffers_.d_flat.get(), buffers_.argmax.get(), plan->batch, buffers_.d_act2.get());
      });
      timed(kConv2Backward, [&] {
        float* g = grads_.get();
        plan->conv2_backward->backward(stream_, buffers_.act1.get(), params_.get() + kParams[2].offset,
                                       buffers_.d_act2.get(), g + kParams[2].offset, g + kParams[3].offset,
                                       buffers_.d_act1.get());
      });
    });
    grads_ready(kConv2);
    compute.enqueue([this, plan] {
      timed(kConv1BackwardWeights, [&] {
        float* g = grads_.get();
        conv1_.backward_weights(buffers_.input.get(), buffers_.act1.get(), buffers_.d_act1.get(), plan->batch,
                                g + kParams[0].offset, g + kParams[1].offset);
      });
    });
    grads_ready(kConv1);
  }

  void sgd_step(const SgdOptions& options) override {
    device_.compute().enqueue([this, options] {
      timed(kSgdOp, [&] {
        sgd_update(params_.get(), grads_.get(), momentum_.get(), kParamCount, options, !momentum_valid_);
      });
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

  std::vector<KernelInfo> kernels(std::uint32_t batch) override {
    const Plan& plan = plan_for(batch);
    std::vector<KernelInfo> out;
    for (int op = 0; op < kOpCount; ++op) out.push_back({kOpNames[op], plan.impl[op]});
    return out;
  }

  std::vector<OpTime> take_profile() override {
    std::vector<OpTime> out;
    run_sync([&] {
      for (int op = 0; op < kOpCount; ++op) {
        out.push_back({kOpNames[op], plan_ != nullptr ? plan_->impl[op] : "", seconds_[op], calls_[op]});
        seconds_[op] = 0;
        calls_[op] = 0;
      }
    });
    return out;
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
        plan = build_plan(engine_, batch, isa_, buffers_, params_.get(), grads_.get());
      } catch (const dnnl::error& e) {
        throw RuntimeFailure(device_.name() + ": oneDNN, plan for batch " + std::to_string(batch) + ": " + e.what());
      }
    });
    warn_if_reference(*plan);
    return *plans_.emplace(batch, std::move(plan)).first->second;
  }

  // Once per process: a reference implementation makes training many times slower.
  void warn_if_reference(const Plan& plan) const {
    static std::once_flag warned;
    for (int op = 0; op < kOpCount; ++op)
      if (is_reference(plan.impl[op]))
        std::call_once(warned, [&] {
          std::cerr << "mnist_mt: warning: " << device_.name() << ": oneDNN runs " << kOpNames[op] << " at batch "
                    << plan.batch << " with a reference implementation (" << plan.impl[op]
                    << "); training will be slow on this CPU\n";
        });
  }

  template <class F>
  void run_sync(F&& task) {
    Stream& compute = device_.compute();
    compute.wait(compute.enqueue(std::forward<F>(task)));
  }

  // Runs `work` (on the compute thread) and adds its time to `op`'s.
  template <class F>
  void timed(Op op, F&& work) {
    const auto start = std::chrono::steady_clock::now();
    work();
    seconds_[op] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++calls_[op];
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
    const float* p = params_.get();
    timed(kConv1Forward, [&] {
      conv1_.forward(buffers_.input.get(), p + kParams[0].offset, p + kParams[1].offset, n, buffers_.act1.get());
    });
    timed(kConv2Forward, [&] {
      run(plan.weights_to_forward, stream_);
      run(plan.conv2, stream_);
    });
    timed(kPoolForward, [&] { pool_.forward(buffers_.act2.get(), n, buffers_.flat.get(), buffers_.argmax.get()); });
    scale0_ = train ? 1.0f / (1.0f - kDropout1) : 1.0f;
    if (train)
      timed(kDropout1Forward, [&] {
        dropout_forward(key, buffers_.samples.get(), n, RandomStream::kDropout0, kFlat, kDropout1, buffers_.flat.get());
      });
    timed(kFc1Forward, [&] { run(plan.fc1, stream_); });
    scale1_ = train ? 1.0f / (1.0f - kDropout2) : 1.0f;
    if (train)
      timed(kDropout2Forward, [&] {
        dropout_forward(key, buffers_.samples.get(), n, RandomStream::kDropout1, kHidden, kDropout2,
                        buffers_.hidden.get());
      });
    timed(kFc2Forward, [&] {
      run(plan.fc2, stream_);
      stream_.wait();
    });
    timed(kLossOp, [&] {
      log_softmax_nll(buffers_.logits.get(), buffers_.labels.get(), n, loss_denominator, buffers_.logp.get(),
                      buffers_.dlogits.get(), sums_);
    });
    samples_ += n;
  }

  CpuDevice& device_;
  const std::uint32_t max_batch_;
  const Isa isa_ = kernel_isa();
  const Conv1Kernels conv1_ = conv1_kernels(isa_);
  const PoolKernels pool_ = pool_kernels(isa_);
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
  std::array<double, kOpCount> seconds_{};
  std::array<std::uint64_t, kOpCount> calls_{};
};

}  // namespace

bool is_reference(std::string_view impl) { return impl.find("ref") != std::string_view::npos; }

std::unique_ptr<CpuReplica> make_cpu_replica(CpuDevice& device, std::uint32_t max_batch) {
  return std::make_unique<CpuReplicaImpl>(device, max_batch);
}

}  // namespace mnist_mt::cpu
