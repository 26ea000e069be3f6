#include "mnist_mt/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::kConstant, ScheduleKind::kStep, ScheduleKind::kOneCycle,
                                   ScheduleKind::kCosine};

// OneCycleLR's anneal_strategy="cos": from start at pct 0 to end at pct 1.
double cos_anneal(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
}

}  // namespace

std::string_view schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kConstant: return "constant";
    case ScheduleKind::kStep: return "step";
    case ScheduleKind::kOneCycle: return "onecycle";
    case ScheduleKind::kCosine: return "cosine";
  }
  return "";
}

std::optional<ScheduleKind> parse_schedule(std::string_view name) {
  for (ScheduleKind kind : kKinds)
    if (schedule_name(kind) == name) return kind;
  return std::nullopt;
}

void check_schedule(const ScheduleOptions& schedule) {
  if (schedule.kind == ScheduleKind::kOneCycle && schedule.warmup > 0)
    throw InputError("a warm-up before the one-cycle schedule: its first phase warms up already", "schedule.warmup");
  if (schedule.kind == ScheduleKind::kStep && schedule.step_epochs == 0)
    throw InputError("a step schedule of 0 epochs per step: must be at least 1", "schedule.step_epochs");
  if (!std::isfinite(schedule.gamma) || schedule.gamma <= 0)
    throw InputError("gamma " + std::to_string(schedule.gamma) + " must be a finite number > 0", "schedule.gamma");
}

Schedule::Schedule(const ScheduleOptions& schedule, const OptimizerOptions& optimizer, std::uint64_t steps_per_epoch,
                   std::uint32_t epochs)
    : options_(schedule),
      base_(base_values(optimizer)),
      // PyTorch cycles an optimizer's "momentum" or "betas"; Adadelta has neither.
      cycles_momentum_(schedule.kind == ScheduleKind::kOneCycle && optimizer.kind != OptimizerKind::kAdadelta),
      steps_per_epoch_(steps_per_epoch),
      total_(steps_per_epoch * epochs) {
  check_schedule(schedule);
  if (schedule.kind == ScheduleKind::kOneCycle && epochs > 0 && total_ < 2)
    throw InputError("a one-cycle schedule needs at least 2 updates in the run, it has " + std::to_string(total_),
                     "schedule");
}

UpdateValues Schedule::at(std::uint64_t step) const {
  UpdateValues v = base_;
  const double k = static_cast<double>(step);
  switch (options_.kind) {
    case ScheduleKind::kConstant: break;
    case ScheduleKind::kStep: {
      // StepLR multiplies the rate by gamma at each multiple of step_size, one product at a time.
      const std::uint64_t epoch = steps_per_epoch_ == 0 ? 0 : step / steps_per_epoch_;
      for (std::uint64_t n = epoch / options_.step_epochs; n > 0; --n) v.lr *= options_.gamma;
      break;
    }
    case ScheduleKind::kOneCycle: {
      // OneCycleLR's two phases, ending at steps pct_start*total - 1 and total - 1.
      const double initial = base_.lr / options_.div_factor;
      const double final_lr = initial / options_.final_div_factor;
      const double first_end = options_.pct_start * static_cast<double>(total_) - 1.0;
      const double last_end = static_cast<double>(total_) - 1.0;
      const bool rising = k <= first_end;
      const double begin = rising ? 0.0 : first_end, end = rising ? first_end : last_end;
      const double pct = end > begin ? (k - begin) / (end - begin) : 1.0;
      v.lr = rising ? cos_anneal(initial, base_.lr, pct) : cos_anneal(base_.lr, final_lr, pct);
      if (cycles_momentum_)
        v.momentum = rising ? cos_anneal(options_.max_momentum, options_.base_momentum, pct)
                            : cos_anneal(options_.base_momentum, options_.max_momentum, pct);
      break;
    }
    case ScheduleKind::kCosine:
      // CosineAnnealingLR's closed form with eta_min 0 and T_max the run's updates.
      v.lr = base_.lr * (1.0 + std::cos(std::numbers::pi * k / static_cast<double>(std::max<std::uint64_t>(total_, 1)))) / 2.0;
      break;
  }
  if (step < options_.warmup) v.lr *= (k + 1.0) / static_cast<double>(options_.warmup);
  return v;
}

}  // namespace mnist_mt
