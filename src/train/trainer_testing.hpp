#pragma once
// Test-only seam of train(), kept out of the public header: a fault or a stall injected
// at one rank and step. The CLI's hidden --inject-fault and --inject-stall set them.
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

struct TrainHooks {
  std::optional<FaultInjection> fault;
  std::optional<StallInjection> stall;
};

struct TrainerTesting {
  static void inject(TrainConfig& config, const FaultInjection& fault) {
    TrainHooks with = hooks(config);
    with.fault = fault;
    config.hooks_ = std::make_shared<const TrainHooks>(std::move(with));
  }
  static void inject(TrainConfig& config, const StallInjection& stall) {
    TrainHooks with = hooks(config);
    with.stall = stall;
    config.hooks_ = std::make_shared<const TrainHooks>(std::move(with));
  }
  // The config's hooks; none set: no fault, no stall.
  static const TrainHooks& hooks(const TrainConfig& config) {
    static const TrainHooks kNone;
    return config.hooks_ ? *config.hooks_ : kNone;
  }
};

}  // namespace mnist_mt
