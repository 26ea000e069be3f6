#include "target.hpp"

#include "metrics.hpp"

namespace mnist_mt {

void TargetWatch::step_started() {
  if (!first_step_) first_step_ = steady_seconds();
}

bool TargetWatch::evaluated(EpochMetrics& m, const StepStats& test, double began, std::uint64_t step) {
  const double now = steady_seconds();
  m.eval_seconds += now - began;
  if (first_step_) eval_seconds_ += now - began;
  if (reached_ || !config_.target_accuracy || !(test.samples > 0) || !first_step_) return false;
  if (!reaches_target(test.correct / test.samples, *config_.target_accuracy)) return false;
  reached_ = test;
  m.time_to_target_s = now - *first_step_;
  m.target_eval_seconds = eval_seconds_;
  m.target_step = step;
  return true;
}

}  // namespace mnist_mt
