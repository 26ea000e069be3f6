#pragma once
// Per-epoch metrics: the phase clock of a training step and the --metrics file.
#include <chrono>
#include <filesystem>
#include <string>

#include "mnist_mt/trainer.hpp"

namespace mnist_mt {

// Seconds between successive laps, to split a step into its phases.
// The host's steady clock in seconds, the clock Device::mark_time() reads too.
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Stopwatch {
 public:
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return seconds;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// One JSON object per line per epoch. The file is replaced (atomically, through any
// symbolic link) as each epoch ends, so a crashed or interrupted run keeps the epochs
// it finished, and no reader ever sees it half-written.
class MetricsFile {
 public:
  // `append` (a run resumed with --load): the lines the file holds now are kept before
  // this run's, but for those of epochs after `kept_epochs` (the checkpoint's completed
  // epochs), which this run trains again: the file holds every epoch once. Throws
  // InputError when they cannot be read.
  MetricsFile(const std::filesystem::path& path, bool append, std::uint64_t kept_epochs = 0);
  void write(const EpochMetrics& m);

 private:
  std::filesystem::path path_;
  std::string text_;  // all the file is to hold
};

}  // namespace mnist_mt
