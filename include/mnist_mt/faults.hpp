#pragma once
// Faults a training run can be told to meet, so that what a failure, a stall or a NaN
// does to every rank can be tested from outside (docs/reliability.md). The CLI's hidden
// --inject-fault, --inject-stall and --inject-nan set them; TrainConfig::faults carries
// them, and a default config has none.
#include <cstdint>
#include <optional>

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

struct Faults {
  std::optional<FaultInjection> fault;
  std::optional<StallInjection> stall;
  std::optional<NanInjection> nan;
};

}  // namespace mnist_mt
