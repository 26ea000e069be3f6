#pragma once
// Rank 0's console output: a live line during an epoch (step, loss, images/s, ETA) and
// a summary after it. On a terminal the line redraws itself with a bar; otherwise it is
// printed as plain lines, ten per epoch, for logs.
#include <chrono>
#include <cstdint>
#include <ostream>

#include "mnist_mt/trainer.hpp"

namespace mnist_mt {

class Progress {
 public:
  // `out` may be null: no output. `images_per_step`: the global batch.
  Progress(std::ostream* out, std::uint64_t images_per_step);
  void start_epoch(std::uint32_t epoch, std::uint32_t steps);  // epoch counts from 1
  // After `done` steps of the epoch; `loss`: mean training loss so far.
  void step(std::uint32_t done, double loss);
  void end_epoch(const EpochMetrics& m);

 private:
  using Clock = std::chrono::steady_clock;

  std::ostream* out_;
  bool terminal_;
  std::uint64_t images_per_step_;
  std::uint32_t epoch_ = 0;
  std::uint32_t steps_ = 0;
  Clock::time_point start_;
  Clock::time_point last_draw_;
  bool line_open_ = false;  // a live line waits for its newline
  std::uint32_t next_line_ = 0;  // the step count at which a log line is due
};

}  // namespace mnist_mt
