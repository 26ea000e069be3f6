#include "replica.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "activations.hpp"
#include "conv.hpp"
#include "errors.hpp"
#include "geometry.hpp"
#include "input.hpp"
#include "kernels.hpp"
#include "fc.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "step_stats.hpp"
#include "update_state.hpp"

namespace mnist_mt::cuda {
namespace {

constexpr std::size_t kConvWorkspaceCap = std::size_t{256} << 20;
constexpr std::size_t kCublasWorkspace = std::size_t{32} << 20;  // cuBLAS's advice for Hopper; ample before it

CudaDevice& activated(CudaDevice& device) {
  device.activate();
  return device;
}

DropoutArgs dropout(const DeviceBatch& batch, const DropoutKey& key, RandomStream stream, float p) {
  return {batch.indices, key.seed, key.epoch, stream, p, 1.0f / (1.0f - p)};
}

class CudaReplica final : public Replica {
 public:
  CudaReplica(CudaDevice& device, std::uint32_t max_batch, const BackendOptions& options)
      : device_(activated(device)),
        max_batch_(max_batch),
        cudnn_(make_cudnn(device.compute())),
        cublas_workspace_(kCublasWorkspace),
        cublas_(make_cublas(device.compute(), cublas_workspace_, options.tf32)),
        conv2_(kConv2Shape, options, &AlgoCache::shared()),
        workspace_(std::max<std::size_t>(tune_convs(), 256)),
        params_(kParamCount),
        grads_(kParamCount),
        act_(max_batch),
        stats_(device),
        input_(device, max_batch, options.device_data) {
    warm_up();
    zero_state();
    device_.wait_stream(stream());
  }

  ~CudaReplica() override {
    // Device memory and handles are released on their device.
    cudaSetDevice(device_.id());
  }

  std::uint32_t max_batch() const override { return max_batch_; }

  // At each new size, conv2's algorithms chosen (timed, or found in the cache, within
  // the workspace taken at setup), then a forward and backward pass on zeros, which
  // loads them now. The gradients they write are overwritten by the next backward; the
  // statistics are cleared.
  void prepare(std::span<const std::uint32_t> sizes) override {
    device_.activate();
    for (const std::uint32_t n : sizes) {
      if (n == 0 || n > max_batch_)
        throw RuntimeFailure(device_.name() + ": prepare for a batch of " + std::to_string(n) + ", replica holds 1.." +
                             std::to_string(max_batch_));
      if (std::find(prepared_.begin(), prepared_.end(), n) != prepared_.end()) continue;
      conv2_.tune(cudnn_.get(), static_cast<int>(n), workspace_.bytes());
      pass_on_zeros(n);
      prepared_.push_back(n);
    }
    // The statistics, not the halt flag nor the count of guarded updates, as on CPU devices.
    stats_.clear(stream(), false);
    device_.wait_stream(stream());
  }

  void set_input(const Batch& batch) override {
    device_.activate();
    batch_ = input_.load(batch, act_.x.data(), kInputMean, kInputStd);
    input_epoch_ = batch.epoch;
    input_.release();
    input_rows_ = labelled_rows_ = batch_.size;
    fc2_done_ = false;
  }

  void hold_data(std::span<const Samples> splits) override { input_.hold(splits); }
  bool plan_epoch(const std::uint8_t* split_images, std::uint32_t epoch, std::span<const std::uint32_t> samples,
                  std::uint32_t rows) override {
    return input_.plan(split_images, epoch, samples, rows);
  }

  void set_scattered_input(std::span<const std::uint32_t> samples) override {
    device_.activate();
    batch_ = input_.upload_indices(samples);
    input_rows_ = batch_.size;
    labelled_rows_ = 0;
    fc2_done_ = false;
  }

  void use_rows(std::uint32_t rows) override {
    if (rows == 0 || rows > input_rows_)
      throw RuntimeFailure(device_.name() + ": use_rows(" + std::to_string(rows) + ") of an input of " +
                           std::to_string(input_rows_) + " rows");
    batch_.size = rows;
  }

  int input_buffer() const override { return input_.slot(); }
  float* input() override { return act_.x.data(); }
  float* logits() override { return act_.z.data(); }
  // A caller may rewrite them (--mode dp): backward() then forms fc2's gradients from them.
  float* logit_grads() override {
    fc2_done_ = false;
    return act_.dlogits.data();
  }

  // fc2, the loss and (training) fc2's backward with fc1's ReLU and dropout backward in
  // one kernel (fc2_loss, up to kFc2LossMaxRows rows); backward() then starts at fc1.
  void forward(bool train, const DropoutKey& key, std::uint32_t loss_denominator) override {
    if (loss_denominator == 0) throw RuntimeFailure(device_.name() + ": forward() with a loss denominator of 0");
    const auto n = static_cast<std::uint32_t>(rows("forward"));
    if (n > kFc2LossMaxRows) {
      forward_logits(train, key);
      loss(0, n, loss_denominator);
      return;
    }
    forward_hidden(train, key);
    if (n > labelled_rows_)
      throw RuntimeFailure(device_.name() + ": forward() of " + std::to_string(n) + " rows, the labelled input has " +
                           std::to_string(labelled_rows_));
    Fc2LossArgs a{.h = act_.h.data(), .w = param(6), .bias = param(7), .labels = batch_.labels, .rows = n,
                  .denominator = static_cast<float>(loss_denominator), .z = act_.z.data(),
                  .logprobs = act_.logprobs.data(), .dlogits = act_.dlogits.data(),
                  .stats = stats_.data() + kStatPending};
    if (train) {
      a.dw = grad(6);
      a.db = grad(7);
      a.dh = act_.dh.data();
      a.dh_bias = grad(5);
      a.scale = fc1_scale_;
    }
    fc2_loss(a, stream());
    input_.release();
    fc2_done_ = train;
  }

  // fc2's bias is added by the loss (log_softmax_nll), on the device that computes it.
  void loss(std::uint32_t first, std::uint32_t rows, std::uint32_t loss_denominator) override {
    device_.activate();
    if (loss_denominator == 0) throw RuntimeFailure(device_.name() + ": loss() with a loss denominator of 0");
    if (rows == 0 || first + rows > labelled_rows_)
      throw RuntimeFailure(device_.name() + ": loss of rows " + std::to_string(first) + ".." +
                           std::to_string(first + rows) + ", the labelled input has " +
                           std::to_string(labelled_rows_));
    const std::size_t at = std::size_t{first} * kFc2Out;
    log_softmax_nll(act_.z.data() + at, param(7), batch_.labels + first, rows, static_cast<float>(loss_denominator),
                    act_.logprobs.data() + at, act_.dlogits.data() + at, stats_.data() + kStatPending, stream());
    input_.release();
  }

  void forward_logits(bool train, const DropoutKey& key) override {
    forward_hidden(train, key);
    linear_forward(cublas_.get(), act_.h.data(), param(6), act_.z.data(), rows("forward"), kFc1Out, kFc2Out);
    input_.release();
  }

  // The forward pass up to fc1's output, after its ReLU and dropout (act_.h). The input
  // slot (its samples and epoch key the dropout) is released by the caller, after its last
  // read: the labels.
  void forward_hidden(bool train, const DropoutKey& key) {
    device_.activate();
    input_.gather_planned(act_.x.data(), kInputMean, kInputStd);
    fc2_done_ = false;
    const int n = rows("forward");
    const DropoutArgs none;
    DropoutArgs drop1 = train ? dropout(batch_, key, RandomStream::kDropout0, kDropout1) : none;
    DropoutArgs drop2 = train ? dropout(batch_, key, RandomStream::kDropout1, kDropout2) : none;
    if (train && device_.recording()) {
      // A recorded step is replayed in later epochs: its masks take the epoch from each
      // replay's input upload. The recording is made from a real step, whose key it checks.
      if (batch_.epoch == nullptr || input_epoch_ != key.epoch)
        throw RuntimeFailure(device_.name() + ": a recorded forward with dropout epoch " + std::to_string(key.epoch) +
                             " needs a set_input() batch of that epoch");
      drop1.epoch_at = drop2.epoch_at = batch_.epoch;
    }
    const Workspace ws = workspace();

    conv1_forward(act_.x.data(), param(0), param(1), static_cast<std::uint32_t>(n), act_.a1.data(), stream());
    conv2_.forward(cudnn_.get(), n, act_.a1.data(), param(2), act_.a2.data(), ws);
    bias_relu_max_pool_dropout(act_.a2.data(), param(3), act_.pooled.data(), n, kC2, kPoolSideInt, drop1, stream());
    linear_forward(cublas_.get(), act_.pooled.data(), param(4), act_.h.data(), n, kFc1In, kFc1Out);
    bias_relu_dropout(act_.h.data(), param(5), n, kFc1Out, 1, drop2, stream());
    pool_scale_ = drop1.scale;
    fc1_scale_ = drop2.scale;
  }

  void backward(const std::function<void(int layer)>& grads_ready) override {
    device_.activate();
    const int n = rows("backward");
    const Workspace ws = workspace();

    // Without a training forward() before (--mode dp: the logits' gradients came from a
    // loss() or a collective), fc2's backward and fc1's ReLU and dropout backward run here.
    const bool fused = std::exchange(fc2_done_, false);
    if (!fused) {
      linear_backward_weight(cublas_.get(), act_.h.data(), act_.dlogits.data(), grad(6), n, kFc1Out, kFc2Out);
      bias_grad(act_.dlogits.data(), grad(7), n, kFc2Out, 1, stream());
    }
    grads_ready(kFc2);
    if (!fused) {
      linear_backward_data(cublas_.get(), param(6), act_.dlogits.data(), act_.dh.data(), n, kFc1Out, kFc2Out);
      relu_dropout_backward(act_.h.data(), act_.dh.data(), std::size_t(n) * kFc1Out, fc1_scale_, stream());
    }

    linear_backward_weight(cublas_.get(), act_.pooled.data(), act_.dh.data(), grad(4), n, kFc1In, kFc1Out);
    if (!fused) bias_grad(act_.dh.data(), grad(5), n, kFc1Out, 1, stream());
    grads_ready(kFc1);
    linear_backward_data(cublas_.get(), param(4), act_.dh.data(), act_.dpooled.data(), n, kFc1In, kFc1Out);
    max_pool_dropout_backward(act_.a2.data(), act_.pooled.data(), act_.dpooled.data(), act_.da2.data(), n, kC2,
                              kPoolSideInt, pool_scale_, act_.pool_sums.data(), act_.pool_ticket.data(), grad(3),
                              stream());
    conv2_.backward_filter(cudnn_.get(), n, act_.a1.data(), act_.da2.data(), grad(2), ws);
    grads_ready(kConv2);
    conv2_.backward_data(cudnn_.get(), n, param(2), act_.da2.data(), act_.da1.data(), ws);
    conv1_backward(act_.x.data(), act_.a1.data(), act_.da1.data(), static_cast<std::uint32_t>(n),
                   act_.conv1_sums.data(), act_.conv1_ticket.data(), grad(0), grad(1), stream());
    grads_ready(kConv1);
  }

  void update(const OptimizerOptions& options) override {
    device_.activate();
    update_.apply(params_.data(), grads_.data(), options, device_.recording(), stream());
  }

  // The communicators here keep no sum of squares: the replica sums the reduced
  // gradients on the device, and the device decides (UpdateState::apply_guarded).
  void guarded_update(const OptimizerOptions& options, const UpdateGuard& guard) override {
    device_.activate();
    update_.apply_guarded(params_.data(), grads_.data(), options, guard, stats_.data(), device_.recording(), stream());
  }

  void set_update_values(const OptimizerOptions& options) override {
    device_.activate();
    update_.set_values(options, stream());
  }

  float* params() override { return params_.data(); }
  float* grads() override { return grads_.data(); }

  void read_params(std::span<float> out) override { download(out, params_, "read_params"); }
  void write_params(std::span<const float> in) override { upload(in, params_, "write_params"); }
  OptimizerState read_state() override {
    OptimizerState state;
    state.first.resize(kParamCount);
    state.second.resize(kParamCount);
    download(state.first, update_.first(), "read_state");
    download(state.second, update_.second(), "read_state");
    unsigned long long applied = 0;
    copy_sync(&applied, update_.applied(), sizeof applied, cudaMemcpyDeviceToHost);
    state.applied = applied;
    return state;
  }
  void write_state(const OptimizerState& state) override {
    if (!state.first.empty()) upload(state.first, update_.first(), "write_state");
    if (!state.second.empty()) upload(state.second, update_.second(), "write_state");
    const unsigned long long applied = state.applied;
    copy_sync(update_.applied(), &applied, sizeof applied, cudaMemcpyHostToDevice);
  }
  void read_grads(std::span<float> out) override { download(out, grads_, "read_grads"); }

  double grad_norm() override {
    device_.activate();
    update_.sum_squares(grads_.data(), stream());
    double sum = 0;
    copy_sync(&sum, update_.total(), sizeof sum, cudaMemcpyDeviceToHost);
    device_.throw_if_aborted();
    return std::sqrt(sum);
  }

  void read_logprobs(std::span<float> out) override {
    const std::size_t count = std::size_t{batch_.size} * kClasses;
    if (out.size() != count)
      throw RuntimeFailure(device_.name() + ": read_logprobs of " + std::to_string(out.size()) +
                           " floats, the last batch has " + std::to_string(count));
    copy_sync(out.data(), act_.logprobs.data(), out.size_bytes(), cudaMemcpyDeviceToHost);
  }

  std::uint64_t snapshot_stats() override { return stats_.snapshot(stream()); }
  std::optional<StepStats> read_stats(std::uint64_t handle, bool wait) override { return stats_.read(handle, wait); }

 private:
  cudaStream_t stream() const { return device_.compute(); }

  float* param(int index) { return params_.data() + kParams[static_cast<std::size_t>(index)].offset; }
  float* grad(int index) { return grads_.data() + kParams[static_cast<std::size_t>(index)].offset; }
  Workspace workspace() const { return {workspace_.data(), workspace_.bytes()}; }

  int rows(const char* call) const {
    if (batch_.size == 0) throw RuntimeFailure(device_.name() + ": " + call + "() before set_input()");
    return static_cast<int>(batch_.size);
  }

  std::size_t tune_convs() { return conv2_.tune(cudnn_.get(), static_cast<int>(max_batch_), kConvWorkspaceCap); }

  // Synchronous copy ordered after the compute stream's work.
  void copy_sync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    device_.activate();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream()));
    device_.wait_stream(stream());
  }
  void download(std::span<float> out, const DeviceBuffer<float>& from, const char* call) {
    expect_params(out.size(), call);
    copy_sync(out.data(), from.data(), from.bytes(), cudaMemcpyDeviceToHost);
  }
  void upload(std::span<const float> in, DeviceBuffer<float>& to, const char* call) {
    expect_params(in.size(), call);
    copy_sync(to.data(), in.data(), to.bytes(), cudaMemcpyHostToDevice);
  }
  void expect_params(std::size_t size, const char* call) const {
    if (size != kParamCount)
      throw RuntimeFailure(device_.name() + ": " + call + " of " + std::to_string(size) + " floats, expected " +
                           std::to_string(kParamCount));
  }

  void zero_state() {
    for (const DeviceBuffer<float>* b : {&params_, &grads_})
      CUDA_CHECK(cudaMemsetAsync(b->data(), 0, b->bytes(), stream()));
    update_.zero(stream());
    stats_.clear(stream(), true);
    act_.zero_tickets(stream());
  }

  // One training step on zeros (weights and input): lazily loaded kernels and cuDNN's
  // engines are set up now, on this thread, rather than in the first step, where
  // loading may wait for work on the device's other streams. Its effects are cleared.
  void warm_up() {
    zero_state();
    pass_on_zeros(max_batch_);
    update(OptimizerOptions{0.0, 0.9, 0.0});
    guarded_update(OptimizerOptions{0.0, 0.9, 0.0}, UpdateGuard{0, false, {}});  // zero_state() clears its count
    prepared_.push_back(max_batch_);
  }

  // Forward (with dropout) and backward of a batch of n zero images.
  void pass_on_zeros(std::uint32_t n) {
    Batch zeros;
    zeros.size = n;
    zeros.images.assign(std::size_t{n} * kImageBytes, 0);
    zeros.labels.assign(n, 0);
    zeros.indices.assign(n, 0);
    set_input(zeros);
    forward(true, {}, n);
    backward([](int) {});
    forward_logits(true, {});  // and fc2 on its own, as --mode dp runs it
    loss(0, n, n);
    backward([](int) {});
    batch_ = {};
    input_rows_ = labelled_rows_ = 0;
  }

  CudaDevice& device_;
  std::uint32_t max_batch_;
  CudnnOwner cudnn_;
  DeviceBuffer<std::uint8_t> cublas_workspace_;  // declared first: released after the handle
  CublasOwner cublas_;
  Conv2d conv2_;  // conv1 runs on kernels of our own (conv1.cu)
  DeviceBuffer<std::uint8_t> workspace_;  // cuDNN's
  DeviceBuffer<float> params_, grads_;
  UpdateState update_;  // the optimizer's state, values and guard
  Activations act_;  // activations, their gradients, the reducing kernels' scratch
  StepStatsBook stats_;
  InputStage input_;
  DeviceBatch batch_;  // size: the rows the next forward and backward use
  std::uint32_t input_rows_ = 0, labelled_rows_ = 0;  // of the last input; those with labels
  std::uint32_t input_epoch_ = 0;  // Batch::epoch of the last set_input()
  std::vector<std::uint32_t> prepared_;  // batch sizes whose algorithms are chosen and loaded
  // Scales the last forward pass gave kept elements (1: no dropout), for backward().
  float pool_scale_ = 1.0f;
  float fc1_scale_ = 1.0f;
  // The last forward() trained: fc2_loss wrote fc2's gradients and the gradient at fc1's
  // output (before its ReLU and dropout), where backward() starts.
  bool fc2_done_ = false;
};

}  // namespace

std::unique_ptr<Replica> make_cuda_replica(CudaDevice& device, std::uint32_t max_batch, const BackendOptions& options) {
  if (max_batch == 0) throw RuntimeFailure(device.name() + ": a replica needs a batch of at least 1");
  return std::make_unique<CudaReplica>(device, max_batch, options);
}

}  // namespace mnist_mt::cuda
