#pragma once
// What the DDP workers and the DataParallel loop share: the devices and communicators,
// the starting state, rank 0's reporting, and the failure that stops every rank.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "metrics.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/trainer.hpp"
#include "progress.hpp"
#include "shared_loaders.hpp"

namespace mnist_mt {

class Run {
 public:
  // Main thread, before any device starts: checks the config against the data, loads
  // the checkpoint or initialises the parameters, opens the metrics file, makes the
  // devices and communicators.
  Run(Backend& backend, const Dataset& data, const TrainConfig& config);

  int world() const { return static_cast<int>(devices.size()); }
  std::uint32_t last_epoch() const { return start.epoch + config.epochs; }
  std::uint32_t steps_in_epoch(std::uint32_t loader_steps) const;
  // Every batch size `rank` will meet: the training batch and the last, smaller
  // evaluation batch, for Replica::prepare().
  std::vector<std::uint32_t> batch_sizes(int rank) const;
  // A DDP worker, once its replica is ready: returns when every rank's is, or throws
  // Aborted once a rank has failed.
  void await_peers();
  // Throws the injected fault when `rank` starts global step `step`.
  void inject_fault(int rank, std::uint64_t step) const;
  // An epoch's training steps: runs `step` (one step, adding its phase times) `steps`
  // times, times them into m, shows progress when `report` (rank 0), sums their stats.
  StepStats train_steps(EpochMetrics& m, std::uint32_t steps, bool report,
                        const std::function<StepStats(PhaseSeconds&)>& step);
  // Rank 0 at the end of an epoch: records, prints and writes the metrics, saves the
  // checkpoint.
  void end_epoch(const EpochMetrics& m, Replica& replica, std::uint64_t step);

  // Any thread: records a failure and releases every peer (aborts the communicators,
  // cancels the loaders).
  void fail(int rank, std::uint64_t step, std::exception_ptr error);
  // Main thread, after the workers joined: throws the first failure that is not Aborted
  // as "rank R failed at step S: why".
  void rethrow_failure() const;

  Backend& backend;
  const Dataset& data;
  const TrainConfig& config;
  Checkpoint start;  // parameters, momentum and loop state to start from
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::unique_ptr<Communicator>> comms;
  SharedLoaders loaders;
  Progress progress;   // rank 0's
  TrainResult result;  // rank 0 writes it

 private:
  struct Failure {
    int rank;
    std::uint64_t step;
    std::exception_ptr error;
  };

  std::optional<MetricsFile> metrics_;
  std::mutex failures_mutex_;  // guards failures_ and ready_
  std::condition_variable peers_cv_;
  std::vector<Failure> failures_;
  int ready_ = 0;  // ranks through await_peers()
};

inline StepStats& operator+=(StepStats& a, const StepStats& b) {
  a.loss_sum += b.loss_sum;
  a.correct += b.correct;
  a.samples += b.samples;
  return a;
}

// The epoch's losses, test accuracy and training rate from stats summed over every
// rank (NaN test figures when nothing was evaluated).
void set_results(EpochMetrics& m, const StepStats& train, const StepStats& test);

// Waits for the device's streams to drain and swallows their errors: the failure
// has been recorded, and no queued work may outlive the buffers it uses.
void drain(Device& device) noexcept;

void train_ddp(Run& run);
void train_dp(Run& run);

}  // namespace mnist_mt
