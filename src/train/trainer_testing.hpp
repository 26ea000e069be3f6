#pragma once
// Test-only seam of train(), kept out of the public header: a fault, a stall or a NaN
// injected at one rank and step. The CLI's hidden --inject-fault, --inject-stall and
// --inject-nan set them.
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "mnist_mt/trainer.hpp"

namespace mnist_mt {

struct FaultInjection {  // rank `rank` throws at global step `step`
  int rank = 0;
  std::uint64_t step = 0;
};

enum class StallPhase { kData, kCompute, kCollective };

struct StallInjection {  // rank `rank` stops making progress in `phase` of step `step`
  int rank = 0;
  std::uint64_t step = 0;
  StallPhase phase = StallPhase::kCompute;
};

struct NanInjection {  // rank `rank`'s loss and gradients are NaN at global step `step`
  int rank = 0;
  std::uint64_t step = 0;
};

struct TrainHooks {
  std::optional<FaultInjection> fault;
  std::optional<StallInjection> stall;
  std::optional<NanInjection> nan;
};

struct TrainerTesting {
  static void inject(TrainConfig& config, const FaultInjection& fault) {
    set(config, [&](TrainHooks& h) { h.fault = fault; });
  }
  static void inject(TrainConfig& config, const StallInjection& stall) {
    set(config, [&](TrainHooks& h) { h.stall = stall; });
  }
  static void inject(TrainConfig& config, const NanInjection& nan) {
    set(config, [&](TrainHooks& h) { h.nan = nan; });
  }
  // The config's hooks; none set: no fault, no stall.
  static const TrainHooks& hooks(const TrainConfig& config) {
    static const TrainHooks kNone;
    return config.hooks_ ? *config.hooks_ : kNone;
  }

 private:
  // The hooks are shared by copies of the config: a change makes a new set.
  static void set(TrainConfig& config, const auto& change) {
    TrainHooks with = hooks(config);
    change(with);
    config.hooks_ = std::make_shared<const TrainHooks>(std::move(with));
  }
};

}  // namespace mnist_mt
