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
  // Epoch `epoch` (from 1) of `steps` steps, of which this run takes those from `first`
  // (a resumed epoch's first are the checkpoint's): the rate and ETA count this run's.
  void start_epoch(std::uint32_t epoch, std::uint32_t steps, std::uint32_t first = 0);
  // After `done` steps of the epoch; `loss`: mean training loss so far.
  void step(std::uint32_t done, double loss);
  // A test-set evaluation inside an epoch (--eval-every) after global step `step`.
  void evaluation(std::uint64_t step, double accuracy);
  void end_epoch(const EpochMetrics& m);

 private:
  using Clock = std::chrono::steady_clock;

  std::ostream* out_;
  bool terminal_;
  std::uint64_t images_per_step_;
  std::uint32_t epoch_ = 0;
  std::uint32_t steps_ = 0;
  std::uint32_t first_ = 0;
  Clock::time_point start_;
  Clock::time_point last_draw_;
  bool line_open_ = false;  // a live line waits for its newline
  std::uint32_t next_line_ = 0;  // the step count at which a log line is due
};

}  // namespace mnist_mt
