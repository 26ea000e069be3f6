// The CPU replica: sequences the step's operations on the device's compute stream: through
// oneDNN or ours where faster (plan.hpp: conv2's forward, the fully-connected layers), and
// our kernels for conv1, the ReLU + max pooling, conv2's backward (Winograd, with the
// pooling's backward), dropout, the loss and the optimizer's update.
// Activations from conv1 to the pooling are in oneDNN's blocked layout for the ISA
// (nChw16c on AVX-512, nChw8c otherwise); the pooling writes PyTorch's flatten order for
// fc1, and dropout runs on that. Parameters, gradients and the optimizer's state are flat
// buffers in state-dict order.
#include "replica.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "conv1.hpp"
#include "fc.hpp"
#include "fc1_factors.hpp"
#include "input.hpp"
#include "kernels.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "optimizer_state.hpp"
#include "plan_cache.hpp"
#include "pool.hpp"
#include "step_stats.hpp"

namespace mnist_mt::cpu {
namespace {

class CpuReplicaImpl final : public CpuReplica {
 public:
  CpuReplicaImpl(CpuDevice& device, std::uint32_t max_batch, bool bf16)
      : device_(device),
        max_batch_(max_batch),
        params_(aligned_zeros<float>(kParamCount)),
        grads_(aligned_zeros<float>(kParamCount)),
        buffers_(max_batch, bf16),
        staged_(max_batch) {
    if (max_batch == 0) throw RuntimeFailure(device.name() + ": replica needs max_batch > 0");
    run_sync([this] {
      engine_ = dnnl::engine(dnnl::engine::kind::cpu, 0);
      stream_ = dnnl::stream(engine_);
    });
    plans_.batch(max_batch);
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
  void prepare(std::span<const std::uint32_t> sizes) override {
    for (const std::uint32_t n : sizes) {
      if (n == 0 || n > max_batch_)
        throw RuntimeFailure(device_.name() + ": prepare for a batch of " + std::to_string(n) + ", replica holds 1.." +
                             std::to_string(max_batch_));
      plans_.batch(n);
    }
    take_stats();
  }

  void exchange_factors(int world) override {
    if (world < 1) throw RuntimeFailure(device_.name() + ": exchange_factors among " + std::to_string(world) + " ranks");
    if (buffers_.bf16()) throw RuntimeFailure(device_.name() + ": exchange_factors with bf16 products (fp32 only)");
    factors_.emplace(world, max_batch_);
  }
  Factors factors() override {
    if (!factors_) return {};
    return {buffers_.flat.get(), buffers_.d_hidden.get(), factors_->inputs(), factors_->output_grads()};
  }
  void grads_from_factors(std::uint32_t rows) override {
    if (!factors_ || rows == 0 || rows > factors_->capacity())
      throw RuntimeFailure(device_.name() + ": fc1's gradients from " + std::to_string(rows) +
                           " rows of factors, the replica gathers " +
                           std::to_string(factors_ ? factors_->capacity() : 0));
    device_.compute().enqueue(
        [this, rows] { timed(kFc1BackwardWeights, [&] { factors_->take(rows, grads_.get()); }); });
  }
  float* params() override { return params_.get(); }
  float* grads() override { return grads_.get(); }

  void set_input(const Batch& batch) override {
    if (batch.size == 0 || batch.size > max_batch_ || batch.images.size() < std::size_t{batch.size} * kImageBytes ||
        batch.labels.size() < batch.size || batch.indices.size() < batch.size)
      throw RuntimeFailure(device_.name() + ": batch of " + std::to_string(batch.size) + " samples, replica holds 1.." +
                           std::to_string(max_batch_) + " (or the batch's buffers are short)");
    const std::uint32_t n = batch.size;
    staged_.stage(device_.compute(), batch);
    staged_.unpacked_at(
        device_.compute().enqueue([this, n] { timed(kInputOp, [&] { staged_.unpack(buffers_, n); }); }));
    input_rows_ = labelled_rows_ = n;
    use_rows(n);
  }

  void set_scattered_input(std::span<const std::uint32_t> samples) override {
    const std::size_t n = samples.size();
    if (n == 0 || n > max_batch_)
      throw RuntimeFailure(device_.name() + ": scattered input of " + std::to_string(n) + " rows, replica holds 1.." +
                           std::to_string(max_batch_));
    staged_.stage_samples(device_.compute(), samples);
    staged_.unpacked_at(
        device_.compute().enqueue([this, n] { staged_.unpack(buffers_, static_cast<std::uint32_t>(n)); }));
    input_rows_ = static_cast<std::uint32_t>(n);
    labelled_rows_ = 0;
    use_rows(input_rows_);
  }

  void use_rows(std::uint32_t rows) override {
    if (rows == 0 || rows > input_rows_)
      throw RuntimeFailure(device_.name() + ": use_rows(" + std::to_string(rows) + ") of an input of " +
                           std::to_string(input_rows_) + " rows");
    rows_ = rows;
    plan_ = nullptr;  // found (or built) when the rows are first used
  }

  float* input() override { return buffers_.input.get(); }
  float* logits() override { return buffers_.logits.get(); }
  float* logit_grads() override { return buffers_.dlogits.get(); }

  void forward(bool train, const DropoutKey& key, std::uint32_t loss_denominator) override {
    if (loss_denominator == 0) throw RuntimeFailure(device_.name() + ": forward with loss_denominator 0");
    forward_logits(train, key);
    loss(0, rows_, loss_denominator);
  }

  void forward_logits(bool train, const DropoutKey& key) override {
    Plan* plan = current_plan();
    device_.compute().enqueue([this, plan, train, key] { run_forward(*plan, train, key); });
  }

  void loss(std::uint32_t first, std::uint32_t rows, std::uint32_t loss_denominator) override {
    if (loss_denominator == 0) throw RuntimeFailure(device_.name() + ": loss with loss_denominator 0");
    if (rows == 0 || first + rows > labelled_rows_)
      throw RuntimeFailure(device_.name() + ": loss of rows " + std::to_string(first) + ".." +
                           std::to_string(first + rows) + ", the labelled input has " +
                           std::to_string(labelled_rows_));
    device_.compute().enqueue([this, first, rows, d = static_cast<float>(loss_denominator)] {
      const std::size_t at = std::size_t{first} * kClasses;
      LossSums sums;
      timed(kLossOp, [&] {
        log_softmax_nll(buffers_.logits.get() + at, buffers_.labels.get() + first, rows, d, buffers_.logp.get() + at,
                        buffers_.dlogits.get() + at, sums);
      });
      stats_.add_forward(sums.loss, sums.correct, rows);
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
      if (!factors_)
        timed(kFc1BackwardWeights, [&] { fc1_backward_weights(*plan, buffers_, grads_.get(), stream_); });
    });
    grads_ready(kFc1);
    compute.enqueue([this, plan] {
      const std::size_t n = plan->batch;
      timed(kFc1BackwardData, [&] { fc1_backward_data(*plan, buffers_, params_.get(), stream_); });
      timed(kDropout1Backward,
            [&] { relu_dropout_backward(buffers_.flat.get(), scale0_, n * kFlat, buffers_.d_flat.get()); });
      timed(kConv2Backward, [&] {  // the pool's backward fused in (kPoolBackward's time is in this one)
        float* g = grads_.get();
        plan->conv2_backward->backward_pooled(stream_, buffers_.act1.get(), params_.get() + kParams[2].offset,
                                              buffers_.d_flat.get(), buffers_.argmax.get(), g + kParams[2].offset,
                                              g + kParams[3].offset, buffers_.d_act1.get());
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

  float* keep_grads(std::size_t slot) override {
    materialize_grads();
    while (kept_.size() <= slot) kept_.push_back(aligned_zeros<float>(kParamCount));
    float* to = kept_[slot].get();
    device_.compute().enqueue([this, to] { std::memcpy(to, grads_.get(), kParamCount * sizeof(float)); });
    return to;
  }

  void update(const OptimizerOptions& options) override {
    device_.compute().enqueue([this, options] { apply(options); });
  }

  void guarded_update(const OptimizerOptions& options, const UpdateGuard& guard) override {
    device_.compute().enqueue([this, options, guard] {
      const std::uint64_t number = guarded_updates_++;
      const std::optional<double> reduced = guard.reduced_squares ? guard.reduced_squares() : std::nullopt;
      const double norm = std::sqrt(reduced ? *reduced : squares());
      if (stats_.admit(guard, number, norm)) apply(options);
    });
  }

  void read_params(std::span<float> out) override { copy_out(params_.get(), out); }
  void write_params(std::span<const float> in) override { copy_in(in, params_.get()); }
  OptimizerState read_state() override {
    OptimizerState state;
    run_sync([&] { state = optimizer_.read(); });
    return state;
  }
  void write_state(const OptimizerState& state) override {
    for (const auto* buffer : {&state.first, &state.second})
      if (!buffer->empty()) check_size(buffer->size());
    run_sync([&] { optimizer_.write(state); });
  }
  void read_grads(std::span<float> out) override {
    materialize_grads();
    copy_out(grads_.get(), out);
  }

  double grad_norm() override {
    double sum = 0;
    run_sync([&] { sum = squares(); });
    return std::sqrt(sum);
  }

  void read_logprobs(std::span<float> out) override {
    if (rows_ == 0) throw RuntimeFailure(device_.name() + ": read_logprobs before set_input");
    const std::size_t count = std::size_t{rows_} * kClasses;
    if (out.size() != count)
      throw RuntimeFailure("read_logprobs: " + std::to_string(out.size()) + " floats, the batch has " +
                           std::to_string(count));
    run_sync([&] { std::memcpy(out.data(), buffers_.logp.get(), count * sizeof(float)); });
  }

  std::uint64_t snapshot_stats() override { return stats_.snapshot(device_.compute()); }
  std::optional<StepStats> read_stats(std::uint64_t handle, bool wait) override {
    return stats_.read(device_.compute(), handle, wait, device_.name());
  }

  std::vector<KernelInfo> kernels(std::uint32_t batch) override {
    const Plan& plan = plans_.batch(batch);
    std::vector<KernelInfo> out;
    for (int op = 0; op < kOpCount; ++op) out.push_back({kOpNames[op], plan.impl[op]});
    return out;
  }

  std::vector<OpTime> take_profile() override {
    std::vector<OpTime> out;
    run_sync([&] {
      for (int op = 0; op < kOpCount; ++op) {
        out.push_back({kOpNames[op], plan_ != nullptr ? plan_->impl[op] : "", seconds_[op]});
        seconds_[op] = 0;
      }
    });
    return out;
  }

 private:
  Plan* current_plan() {
    if (rows_ == 0) throw RuntimeFailure(device_.name() + ": replica used before set_input");
    if (plan_ == nullptr) plan_ = &plans_.batch(rows_);
    return plan_;
  }

  // Compute thread: the optimizer's update, and the stats of the forward passes since the
  // last update.
  void apply(const OptimizerOptions& options) {
    timed(kUpdateOp,
          [&] { optimizer_.update(params_.get(), grads_.get(), factors_ ? &*factors_ : nullptr, options); });
  }

  // Compute thread: the gradients' sum of squares (fc1's from its factors while pending).
  double squares() const {
    return factors_ && factors_->pending() ? factors_->squares(grads_.get()) : sum_of_squares(grads_.get(), kParamCount);
  }
  // Writes fc1's weight gradient into grads() while it is only in the factors.
  void materialize_grads() {
    if (factors_) device_.compute().enqueue([this] { factors_->materialize(grads_.get()); });
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
    try {
      work();
    } catch (const RuntimeFailure& e) {  // a oneDNN step's failure names its operation, not the device
      throw RuntimeFailure(device_.name() + ": " + e.what());
    }
    seconds_[op] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

  void run_forward(const Plan& plan, bool train, const DropoutKey& key) {
    const std::uint32_t n = plan.batch;
    const float* p = params_.get();
    timed(kConv1Forward, [&] {
      conv1_.forward(buffers_.input.get(), p + kParams[0].offset, p + kParams[1].offset, n, buffers_.act1.get());
    });
    timed(kConv2Forward, [&] {
      if (plan.conv2_forward) {
        plan.conv2_forward->forward(stream_, buffers_.act1.get(), p + kParams[2].offset, p + kParams[3].offset,
                                    buffers_.act2.get());
        return;
      }
      run(plan.weights_to_forward, stream_);
      run(plan.conv2, stream_);
    });
    timed(kPoolForward, [&] { pool_.forward(buffers_.act2.get(), n, buffers_.flat.get(), buffers_.argmax.get()); });
    scale0_ = train ? 1.0f / (1.0f - kDropout1) : 1.0f;
    if (train)
      timed(kDropout1Forward, [&] {
        dropout_forward(key, buffers_.samples.get(), n, RandomStream::kDropout0, kFlat, kDropout1, buffers_.flat.get());
      });
    timed(kFc1Forward, [&] { fc1_forward(plan, buffers_, p, stream_); });
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
  }

  CpuDevice& device_;
  const std::uint32_t max_batch_;
  const Isa isa_ = kernel_isa();
  const Conv1Kernels conv1_ = conv1_kernels(isa_);
  const PoolKernels pool_ = pool_kernels(isa_);
  dnnl::engine engine_;
  dnnl::stream stream_;
  Aligned<float> params_, grads_;
  OptimizerBuffers optimizer_;
  Buffers buffers_;
  PlanCache plans_{device_, engine_, isa_, buffers_, params_.get(), grads_.get()};
  std::optional<Fc1Factors> factors_;  // exchange_factors(): every rank's fc1 factors

  // Host side: the rows of the last input, those that have labels, those the next
  // forward and backward use and their plan (null until first used); the staging copy.
  std::uint32_t input_rows_ = 0, labelled_rows_ = 0, rows_ = 0;
  Plan* plan_ = nullptr;
  StagedInput staged_;

  // Compute-stream side.
  std::uint64_t guarded_updates_ = 0;  // guarded_update() calls run (compute thread)
  float scale0_ = 1.0f, scale1_ = 1.0f;  // dropout scales of the last forward
  StepStatsBook stats_;
  std::array<double, kOpCount> seconds_{};
  std::vector<Aligned<float>> kept_;  // keep_grads()' buffers (host side; tasks hold their pointers)
};

}  // namespace

std::unique_ptr<CpuReplica> make_cpu_replica(CpuDevice& device, std::uint32_t max_batch, bool bf16) {
  return std::make_unique<CpuReplicaImpl>(device, max_batch, bf16);
}

}  // namespace mnist_mt::cpu
