#pragma once
// One device's copy of the network (docs/architecture.md decision 1). Each call enqueues work on
// the device's compute stream and returns; only take_stats() and the read_/write_
// calls wait for the device.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "mnist_mt/batch.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/optimizer.hpp"

namespace mnist_mt {

// Identifies the dropout masks of a forward pass (docs/architecture.md decision 9).
struct DropoutKey {
  std::uint64_t seed = 0;
  std::uint32_t epoch = 0;
  bool operator==(const DropoutKey&) const = default;
};

// A training step whose update guarded_update() dropped: its loss (this replica's) and
// its gradients' norm, one of them non-finite.
struct NonFiniteStep {
  std::uint64_t step = 0;
  double loss_sum = 0;
  double grad_norm = 0;
};

// Sums over the samples of the forward passes since the last snapshot, less those of the
// steps whose update was dropped.
struct StepStats {
  double loss_sum = 0;   // sum of per-sample NLL
  double correct = 0;    // samples whose argmax equals the label
  double samples = 0;
  std::uint64_t skipped = 0;                // updates guarded_update() dropped
  std::optional<NonFiniteStep> non_finite;  // the first of them
};

// Sums; the first non-finite step is kept.
inline StepStats& operator+=(StepStats& a, const StepStats& b) {
  a.loss_sum += b.loss_sum;
  a.correct += b.correct;
  a.samples += b.samples;
  a.skipped += b.skipped;
  if (!a.non_finite) a.non_finite = b.non_finite;
  return a;
}

// What guarded_update() checks before it updates. The same for every update of a run:
// a recorded step (Device::begin_record) replays it as it was.
struct UpdateGuard {
  // The global step of the replica's first guarded update: its n-th (from 0) is step
  // first_step + n, recorded when it is dropped. The device counts them itself.
  std::uint64_t first_step = 0;
  // A dropped update halts the replica: every later guarded update is dropped too (the
  // run stops at the next snapshot the host reads), so the model stays the last good one.
  bool halt = true;
  // The sum of squares of the reduced gradients when the communicator kept it (see
  // Communicator::take_reduced_squares), else nullopt and the replica sums them itself.
  // Called once per update, where the update runs: on CPU devices on the compute
  // stream's thread, after the wait for the comm stream.
  std::function<std::optional<double>()> reduced_squares;
};

class Replica {
 public:
  virtual ~Replica() = default;
  virtual std::uint32_t max_batch() const = 0;

  // Setup: readies the replica for batches of each of `sizes` (1..max_batch()): the
  // algorithms chosen, their workspaces taken, kernels loaded, so that no step sets
  // anything up while peers wait in a collective. Parameters and optimizer state are
  // left as they are; the step statistics are cleared.
  virtual void prepare(std::span<const std::uint32_t> sizes) = 0;
  // The run's splits, which outlive the replica's use of them: a replica that can keep
  // them in device memory does (GPUs, unless BackendOptions::device_data is off: once per
  // GPU, as uint8), and set_input() of a batch of one of them (Batch::split_images) then
  // copies only the batch's sample indices and gathers its rows on the device. Others
  // ignore them. Once, at setup (a recorded step holds their addresses).
  virtual void hold_data(std::span<const Samples> /*splits*/) {}
  // A rank's training samples of one epoch (Loader::rank_samples), `rows` a step, of the
  // split whose images are `split_images`: a replica holding that split keeps them too
  // and returns true; set_input() of the batch that is next among them then copies
  // nothing, input() is written by forward(), which gathers the rows by a step counter on
  // the device (so a recorded step replays alone), and input_buffer() is a third buffer.
  // A batch of that split and epoch out of the plan's order is an error (RuntimeFailure),
  // and ends the plan. Empty `samples`: no plan. Others return false.
  virtual bool plan_epoch(const std::uint8_t* /*split_images*/, std::uint32_t /*epoch*/,
                          std::span<const std::uint32_t> /*samples*/, std::uint32_t /*rows*/) {
    return false;
  }
  // Copies the batch to the device and normalises it, (x/255 - mean)/std (a batch of a
  // held split: gathers it there by its indices; a planned one: forward() does). The
  // batch's host memory may be reused once this returns.
  virtual void set_input(const Batch& batch) = 0;
  // Forward pass and loss of the current input. `train` applies dropout. The gradient
  // the next backward() starts from is d(sum of NLL)/d(logits) / loss_denominator:
  // the batch size for DDP, the global batch for the DataParallel baseline.
  virtual void forward(bool train, const DropoutKey& key, std::uint32_t loss_denominator) = 0;
  // The DataParallel baseline (--mode dp) splits forward() at the network's output and
  // moves rows between devices with collectives:
  // forward() without the loss: the network's output rows, into logits().
  virtual void forward_logits(bool train, const DropoutKey& key) = 0;
  // The loss of rows [first, first + rows) of logits() against the labels of the last
  // set_input() (a batch that had those rows), into the same rows of logit_grads(), as
  // forward() computes it; its stats are this replica's.
  virtual void loss(std::uint32_t first, std::uint32_t rows, std::uint32_t loss_denominator) = 0;
  // The next forward and backward run on the first `rows` rows of the last set_input().
  virtual void use_rows(std::uint32_t rows) = 0;
  // Rows [0, samples.size()) of input() were written by a collective (with
  // Device::compute_wait_comm() before the next forward); `samples` (host memory, free
  // once this returns) are their sample indices, which key dropout. No labels: a replica
  // fed this way computes no loss.
  virtual void set_scattered_input(std::span<const std::uint32_t> samples) = 0;
  // Which of the replica's input buffers the last set_input() or set_scattered_input()
  // filled: GPUs alternate two, so that an upload overlaps the step before it, and a
  // planned batch (plan_epoch) is a third. A recorded step reads the buffer it was
  // recorded with.
  virtual int input_buffer() const { return 0; }
  // Flat device buffers of max_batch() rows: the normalised images (kImageBytes floats a
  // row), the output rows the loss reads (kClasses floats; on GPUs fc2's output before
  // its bias, which the loss adds) and their gradients, which backward() starts from.
  virtual float* input() = 0;
  virtual float* logits() = 0;
  virtual float* logit_grads() = 0;
  // Backward pass from fc2 down to conv1. Right after enqueueing layer l's parameter
  // gradients (into grads(), layer_range(l)), calls grads_ready(l) on the calling
  // thread; work the callback enqueues on the comm stream after
  // Device::comm_wait_compute() sees those gradients.
  virtual void backward(const std::function<void(int layer)>& grads_ready) = 0;
  // A rank computing several shards of the world's batch in turn keeps each shard's
  // gradients but the last one's while the next backward overwrites grads(): enqueues a
  // copy of grads() into the replica's buffer `slot` (kParamCount floats, made at the
  // first call for it) and returns that buffer. Only for backends whose communicators
  // sum shards (Backend::sums_shards); others throw.
  virtual float* keep_grads(std::size_t /*slot*/) {
    throw RuntimeFailure("this replica keeps no gradients of several shards");
  }
  // --exchange factors (docs/distributed.md): fc1's weight gradient summed over the ranks
  // is the sum of G_r^T X_r, G_r the gradient at fc1's output and X_r fc1's input on rank
  // r, so the ranks exchange those factors and each forms the product over the world's
  // rows. From this call on, backward() leaves fc1's weight and bias gradients unwritten
  // (grads_ready(kFc1) still comes), and the replica holds buffers of `world` x
  // max_batch() rows for every rank's factors. Before prepare(). Replicas without it throw.
  virtual void exchange_factors(int /*world*/) {
    throw RuntimeFailure("this replica does not exchange fc1's factors (--exchange factors runs on CPU devices)");
  }
  // Device buffers, after exchange_factors(): this replica's factors, X after the last
  // forward() (rows x kFlat floats) and G after backward() has reported kFc1 (rows x
  // kHidden), and those of every rank, which an allgather fills (world x max_batch() rows).
  struct Factors {
    const float* input = nullptr;
    const float* output_grad = nullptr;
    float* all_inputs = nullptr;
    float* all_output_grads = nullptr;
  };
  virtual Factors factors() { return {}; }
  // Enqueues fc1's weight and bias gradients from the first `rows` rows of the gathered
  // factors, averaged over the world (the same bits for 1 rank x `rows` when the world is a
  // power of two). A replica may keep the weight gradient in the factors and form it as
  // the next update() takes it (the CPU's, in chunks of rows while they are in cache);
  // read_grads(), grad_norm() and keep_grads() see it whole.
  virtual void grads_from_factors(std::uint32_t /*rows*/) {}
  // One step of the optimizer (optimizer.hpp) from grads(), with options.lr and the
  // momentum (SGD) or beta1 (Adam) of this update: a schedule passes with_values().
  virtual void update(const OptimizerOptions& options) = 0;
  // update() on the device's own decision, without the host waiting: applied when the
  // gradients' 2-norm and the loss of the training forward since the last update are
  // finite; otherwise dropped (the optimizer's state untouched, that forward's stats left
  // out, the step counted in StepStats::skipped and recorded in non_finite), and every
  // later one too when the guard halts and once the replica has halted.
  virtual void guarded_update(const OptimizerOptions& options, const UpdateGuard& guard) = 0;
  // A device that records its steps (Device::begin_record) reads an update's learning
  // rate and momentum from its own memory: this enqueues their values for the next
  // update, replayed or not, and must precede it outside the recording. Others take them
  // from update()'s options.
  virtual void set_update_values(const OptimizerOptions& /*options*/) {}

  // Flat device buffers of kParamCount floats in state-dict order.
  virtual float* params() = 0;
  virtual float* grads() = 0;

  // Synchronous host copies.
  virtual void read_params(std::span<float> out) = 0;
  virtual void write_params(std::span<const float> in) = 0;
  // Both state buffers (zeros before the first update) and the updates applied.
  virtual OptimizerState read_state() = 0;
  // Buffers given (kParamCount floats each) replace the replica's; an empty one leaves it.
  virtual void write_state(const OptimizerState& state) = 0;
  // The 2-norm of grads(), synchronous: non-finite when any gradient is. Once the
  // gradients are reduced every rank holds the same bits, and so gets the same norm.
  virtual double grad_norm() = 0;
  // Enqueues a copy of the stats since the last snapshot, resetting them, and returns
  // its handle at once. At most kSnapshots may be unread.
  virtual std::uint64_t snapshot_stats() = 0;
  // Snapshot `handle`'s stats once the device has made it: nullopt before, unless `wait`.
  // Each snapshot is read once.
  virtual std::optional<StepStats> read_stats(std::uint64_t handle, bool wait) = 0;
  static constexpr std::uint64_t kSnapshots = 4;
  // Waits for the device, returns the stats since the last snapshot and resets them.
  StepStats take_stats() { return *read_stats(snapshot_stats(), true); }
  // Log-probabilities of the last forward pass, batch x 10, synchronous (eval
  // confusion matrices, predict, tests).
  virtual void read_logprobs(std::span<float> out) = 0;

 private:
  friend struct ReplicaTesting;  // src/model/replica_testing.hpp
  // Synchronous host copy of the gradients, for tests.
  virtual void read_grads(std::span<float> out) = 0;
};

}  // namespace mnist_mt
