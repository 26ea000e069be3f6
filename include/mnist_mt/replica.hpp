#pragma once
// One device's copy of the network (DESIGN.md decision 1). Each call enqueues work on
// the device's compute stream and returns; only take_stats() and the read_/write_
// calls wait for the device.
#include <cstdint>
#include <functional>
#include <span>

#include "mnist_mt/batch.hpp"

namespace mnist_mt {

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

// Identifies the dropout masks of a forward pass (DESIGN.md decision 5).
struct DropoutKey {
  std::uint64_t seed = 0;
  std::uint32_t epoch = 0;
};

// Sums over the samples of the forward passes since the last take_stats().
struct StepStats {
  double loss_sum = 0;   // sum of per-sample NLL
  double correct = 0;    // samples whose argmax equals the label
  double samples = 0;
};

class Replica {
 public:
  virtual ~Replica() = default;
  virtual std::uint32_t max_batch() const = 0;

  // Setup: readies the replica for batches of each of `sizes` (1..max_batch()): the
  // algorithms chosen, their workspaces taken, kernels loaded, so that no step sets
  // anything up while peers wait in a collective. Parameters and momentum are left as
  // they are; the step statistics are cleared.
  virtual void prepare(std::span<const std::uint32_t> sizes) = 0;
  // Copies the batch to the device and normalises it, (x/255 - mean)/std. The batch's
  // host memory may be reused once this returns.
  virtual void set_input(const Batch& batch) = 0;
  // Forward pass and loss of the current input. `train` applies dropout. The gradient
  // the next backward() starts from is d(sum of NLL)/d(logits) / loss_denominator:
  // the batch size for DDP, the global batch for the DataParallel baseline.
  virtual void forward(bool train, const DropoutKey& key, std::uint32_t loss_denominator) = 0;
  // Backward pass from fc2 down to conv1. Right after enqueueing layer l's parameter
  // gradients (into grads(), layer_range(l)), calls grads_ready(l) on the calling
  // thread; work the callback enqueues on the comm stream after
  // Device::comm_wait_compute() sees those gradients.
  virtual void backward(const std::function<void(int layer)>& grads_ready) = 0;
  // PyTorch's SGD: g += wd*p; buf = momentum*buf + g (buf = g on the first step);
  // p -= lr*buf.
  virtual void sgd_step(const SgdOptions& options) = 0;

  // Flat device buffers of kParamCount floats in state-dict order.
  virtual float* params() = 0;
  virtual float* grads() = 0;

  // Synchronous host copies.
  virtual void read_params(std::span<float> out) = 0;
  virtual void write_params(std::span<const float> in) = 0;
  virtual void read_momentum(std::span<float> out) = 0;  // zeros before the first step
  virtual void write_momentum(std::span<const float> in) = 0;
  // The 2-norm of grads(), synchronous: non-finite when any gradient is. Once the
  // gradients are reduced every rank holds the same bits, and so gets the same norm.
  virtual double grad_norm() = 0;
  // Waits for the device, returns the stats since the last call and resets them.
  virtual StepStats take_stats() = 0;
  // Log-probabilities of the last forward pass, batch x 10, synchronous (eval
  // confusion matrices, predict, tests).
  virtual void read_logprobs(std::span<float> out) = 0;

 private:
  friend struct ReplicaTesting;  // src/model/replica_testing.hpp
  // Synchronous host copy of the gradients, for tests.
  virtual void read_grads(std::span<float> out) = 0;
};

}  // namespace mnist_mt
