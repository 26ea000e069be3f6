#pragma once
// A CPU replica's optimizer: its two state buffers in state-dict order (OptimizerState's
// first and second) and its count of updates. Runs on the device's compute thread.
#include <cstdint>

#include "aligned.hpp"
#include "fc1_factors.hpp"
#include "mnist_mt/optimizer.hpp"
#include "mnist_mt/replica.hpp"

namespace mnist_mt::cpu {

class OptimizerBuffers {
 public:
  OptimizerBuffers();
  // One update of `params` from `grads` (fc1's weight gradient from `factors` while they
  // hold it pending: Fc1Factors::update), with the update's rates from `options`.
  void update(float* params, const float* grads, Fc1Factors* factors, const OptimizerOptions& options);
  OptimizerState read() const;
  // A state buffer left empty keeps its values; sizes are the caller's to check.
  void write(const OptimizerState& state);

 private:
  Aligned<float> first_, second_;
  std::uint64_t applied_ = 0;  // updates applied
};

}  // namespace mnist_mt::cpu
