#pragma once
// --target-accuracy for one worker: times the run from its first step and each test-set
// evaluation, and records in the epoch's metrics when the world's test accuracy first
// reaches the target. Every rank sees the same world stats, so every rank decides alike.
#include <cstdint>
#include <optional>

#include "mnist_mt/replica.hpp"
#include "mnist_mt/trainer.hpp"

namespace mnist_mt {

class TargetWatch {
 public:
  explicit TargetWatch(const TrainConfig& config) : config_(config) {}
  // Before each training step: the first starts the clock.
  void step_started();
  // After an evaluation begun at `began` (steady_seconds) whose world stats are `test`,
  // at global step `step`: adds its time to m.eval_seconds; when the target is reached,
  // records it in m and returns true.
  bool evaluated(EpochMetrics& m, const StepStats& test, double began, std::uint64_t step);
  bool reached() const { return reached_.has_value(); }
  // The world stats of the evaluation that reached the target.
  const StepStats& reached_test() const { return *reached_; }

 private:
  const TrainConfig& config_;
  std::optional<double> first_step_;  // steady_seconds
  double eval_seconds_ = 0;           // since the first step
  std::optional<StepStats> reached_;
};

}  // namespace mnist_mt
