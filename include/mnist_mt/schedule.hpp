#pragma once
// Learning-rate schedules with torch.optim.lr_scheduler's definitions: StepLR (stepped at
// epoch ends), OneCycleLR (stepped after every update, cycling SGD's momentum or Adam's
// beta1 as its default cycle_momentum does), CosineAnnealingLR (stepped after every
// update, over the run's updates, to 0), each optionally after a linear warm-up. A
// schedule is a function of the update's global step, so a resumed run continues it
// from the checkpoint's step.
#include <cstdint>
#include <optional>
#include <string_view>

#include "mnist_mt/optimizer.hpp"

namespace mnist_mt {

enum class ScheduleKind : std::uint8_t { kConstant, kStep, kOneCycle, kCosine };
std::string_view schedule_name(ScheduleKind kind);  // "constant", "step", "onecycle", "cosine"
std::optional<ScheduleKind> parse_schedule(std::string_view name);

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kConstant;
  std::uint32_t step_epochs = 1;  // StepLR's step_size, in epochs
  double gamma = 0.1;             // StepLR's factor
  // Updates of linear warm-up: update k < warmup runs at (k + 1)/warmup of the schedule's
  // rate (LinearLR(start_factor=1/warmup, total_iters=warmup-1) ahead of the schedule).
  std::uint32_t warmup = 0;
  // OneCycleLR's defaults; the optimizer's lr is its max_lr.
  double pct_start = 0.3;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
};

// Throws InputError ("schedule.warmup", "schedule.step_epochs", "schedule.gamma") for
// options that define no schedule: a warm-up before OneCycleLR (whose first phase is
// one), a step of 0 epochs, a gamma not finite and positive.
void check_schedule(const ScheduleOptions& schedule);

class Schedule {
 public:
  // `steps_per_epoch` and `epochs`: the run's, whose product OneCycleLR and
  // CosineAnnealingLR span. Throws what check_schedule() throws, and InputError
  // ("schedule") for a one-cycle run of fewer than 2 updates.
  Schedule(const ScheduleOptions& schedule, const OptimizerOptions& optimizer, std::uint64_t steps_per_epoch,
           std::uint32_t epochs);
  // The learning rate and momentum of the update at global step `step` (from 0).
  UpdateValues at(std::uint64_t step) const;

 private:
  ScheduleOptions options_;
  UpdateValues base_;
  bool cycles_momentum_;
  std::uint64_t steps_per_epoch_;
  std::uint64_t total_;
};

}  // namespace mnist_mt
