#pragma once
// What the DDP workers and the DataParallel loop share: the devices and communicators,
// the starting state, rank 0's reporting, and the failure that stops every rank.
#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "metrics.hpp"
#include "exchange.hpp"
#include "failures.hpp"
#include "fault_injection.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/schedule.hpp"
#include "mnist_mt/trainer.hpp"
#include "progress.hpp"
#include "saver.hpp"
#include "shared_loaders.hpp"
#include "start.hpp"
#include "trace.hpp"
#include "watchdog.hpp"

namespace mnist_mt {

// How many steps apart the DDP workers read their stats (and phase times) from the device,
// on every rank at the same steps.
constexpr std::uint64_t kReadEvery = 16;


class Run {
 public:
  // Main thread, before any device starts: checks the config against the data, loads
  // the checkpoint or initialises the parameters, opens the metrics file, makes the
  // devices and communicators.
  Run(Backend& backend, const Dataset& data, const TrainConfig& config);

  // This process's ranks, and the world's (every process's).
  int ranks() const { return static_cast<int>(devices_.size()); }
  int world() const { return place_.world; }
  // The world's shards of its batch, the images of each, and this process's rank
  // `rank`'s: from first_shard(rank), shard_count(rank) of them.
  std::uint32_t shards() const { return layout_.shards; }
  std::uint32_t shard_batch() const { return layout_.batch; }
  std::uint32_t first_shard(int rank) const;
  std::uint32_t shard_count(int rank) const { return first_shard(rank + 1) - first_shard(rank); }
  // The world rank of this process's rank `rank`.
  int global(int rank) const { return place_.first_rank + rank; }
  std::uint32_t last_epoch() const { return config_.epochs; }
  std::uint32_t steps_in_epoch(std::uint32_t loader_steps) const;
  // The update of global step `step`: the optimizer's options with the schedule's values.
  OptimizerOptions update_options(std::uint64_t step) const {
    return with_values(config_.optimizer, schedule_.at(step));
  }
  // Every batch size `rank` will meet: the training batch and the last, smaller
  // evaluation batch, for Replica::prepare().
  std::vector<std::uint32_t> batch_sizes(int rank) const;
  // A DDP worker, once its replica is ready: returns when every rank's is, or throws
  // Aborted once a rank has failed.
  void await_peers() { failures_.await_peers(); }
  // The step of `epoch` to start at: the checkpoint's position in its epoch, else 0.
  std::uint32_t first_step(std::uint32_t epoch) const { return epoch == start_.epoch ? start_.epoch_step : 0; }
  // The faults of config().faults, at the loops' points (fault_injection.hpp).
  FaultInjector& faults() { return faults_; }
  // After forward: a non-finite loss fails the run under --on-nan stop; under skip the
  // step goes on, its reduced gradients decide.
  void check_loss(double loss_sum) const;
  // After the gradients are reduced, which leaves every rank with the same bits and so
  // the same norm: whether to apply the step's update. See NanPolicy.
  bool apply_update(int rank, double loss_sum, double grad_norm) const;
  // A DDP worker that read a step its device dropped (Replica::guarded_update) from its
  // stats; every rank reads a dropped norm at the same step. Throws what ends the run,
  // if it ends: with --on-nan stop the ranks agree (through `comm`) on one report, the
  // lowest rank whose own loss was non-finite, else rank 0 for the norm.
  void on_non_finite(Communicator& comm, const NonFiniteStep& step);
  // The guard of a DDP worker's updates: its replica is made for the run, so its first
  // guarded update is the run's first step.
  UpdateGuard update_guard(Communicator& comm) const;
  // Rank `rank` enters `phase` of global step `step` (the watchdog's progress).
  void beat(int rank, std::uint64_t step, Phase phase) { watchdog_->beat(rank, step, phase); }

  // `rank`'s training steps of an epoch, [first, steps): runs `step` (one step, adding what it
  // times to the phases and advancing `global`), and `read(wait)` every kReadEvery
  // steps, before each save (wait: true) and once at the end (true): the caller adds its
  // stats to `total` and m's phases there. `rank0` (rank 0's replica, null elsewhere)
  // shows progress and saves every save_every steps. With a target accuracy and
  // eval_every, `evaluate` runs after every eval_every-th global step but an epoch's last
  // (after read(true)), and its true, the target reached, ends the epoch there. Times the
  // epoch into m. Returns false when a stop request ended the epoch early, which happens
  // at the same global step on every rank.
  bool train_steps(int rank, EpochMetrics& m, std::uint32_t first, std::uint32_t steps, Replica* rank0, std::uint64_t& global,
                   const StepStats& total, const std::function<void(PhaseSeconds&)>& step,
                   const std::function<void(bool wait)>& read, const std::function<bool()>& evaluate);
  // Rank 0 at the end of an epoch, or where the target accuracy was reached in it
  // (`epoch_step` steps into it, 0: at its end): records, prints and writes the metrics,
  // saves the checkpoint at that position.
  void end_epoch(EpochMetrics m, Replica& replica, std::uint64_t step, std::uint32_t epoch_step = 0);
  // Rank 0 after a stop request: saves where the run stands and records it.
  void end_interrupted(Replica& replica, std::uint32_t epoch, std::uint32_t epoch_step, std::uint64_t step);

  // Rank 0 where its evaluation inside an epoch (eval_every) ends: the progress line.
  void report_evaluation(std::uint64_t step, double accuracy) { progress_.evaluation(step, accuracy); }
  // Rank 0 at the end of training: the final parameters, for the result.
  void keep_params(Replica& replica);
  // Main thread, once the run is over: what train() returns.
  TrainResult take_result() { return std::move(result_); }

  // Any thread: records a failure of this process's rank `rank` (-1: of none) and
  // releases every peer (aborts the communicators, cancels the loaders).
  void fail(int rank, std::uint64_t step, std::exception_ptr error) { failures_.fail(rank, step, std::move(error)); }
  // Main thread, after the workers joined: throws the first failure that is not Aborted
  // as "rank R failed at step S: why" (R the world rank; "rank R (host H)" across
  // processes).
  void rethrow_failure() const { failures_.rethrow(); }
  // Releases every rank that waits in a collective (a group of them cannot complete).
  void abort_collectives();

  Backend& backend() const { return backend_; }
  bool bf16_products() const { return backend_.precision() == Precision::kBf16; }
  const Dataset& data() const { return data_; }
  // The training and the test split, in this order, for Replica::hold_data.
  std::span<const Samples> samples() const { return samples_; }
  const TrainConfig& config() const { return config_; }
  // The parameters, optimizer state and loop state the run starts from.
  const Checkpoint& start() const { return start_; }
  Device& device(int rank) const { return *devices_[static_cast<std::size_t>(rank)]; }
  Communicator& comm(int rank) const { return *comms_[static_cast<std::size_t>(rank)]; }
  // The loaders' epochs, shared by the ranks (thread-safe).
  SharedLoaders& loaders() { return loaders_; }
  // The --trace log, or null.
  TraceLog* trace() { return trace_ ? &*trace_ : nullptr; }
  // Whether the DDP workers exchange fc1's factors instead of its gradient (exchange.hpp).
  bool factors() const { return factors_; }
  // Whether every step's phases are timed on the device (TrainConfig::phase_times, and
  // a trace, which draws them).
  bool phase_times() const { return config_.phase_times || config_.trace.has_value(); }

 private:
  // An epoch's steps, as the training loader makes them (drop_last), before max_steps.
  std::uint32_t training_steps() const;
  // The place for the communicators: each rank's shard count, when not one each.
  Place sharded_place() const;
  // The loaders' shards: training's by the layout, evaluation's a rank each.
  SharedLoaders::Shards train_shards() const;
  SharedLoaders::Shards test_shards() const;
  // With the test accuracy measured at this position, where it was (measured_).
  void save(Replica& replica, std::uint32_t epoch, std::uint32_t epoch_step, std::uint64_t step,
            const std::filesystem::path& path);
  bool watch_tick();
  // The processes an exchange under way still waits for, "process P (host H, rank R)"
  // each; empty when none.
  std::string missing_processes() const;
  [[noreturn]] void exit_hung() const;

  Backend& backend_;
  const Dataset& data_;
  const std::array<Samples, 2> samples_;
  const TrainConfig& config_;
  const Place place_;  // this process's ranks in the world
  const Checkpoint start_;
  // The world's test accuracy at the last position the test set was evaluated at (an
  // epoch's end, where the target was reached, or the start's, its checkpoint's on the
  // same data set): what a checkpoint of that position records.
  struct Measured {
    std::uint32_t epoch, epoch_step;
    double accuracy;
  };
  std::optional<Measured> measured_;
  const ShardLayout layout_;
  const bool factors_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  SharedLoaders loaders_;
  Progress progress_;   // rank 0's
  TrainResult result_;  // rank 0 writes it
  std::optional<TraceLog> trace_;
  std::optional<MetricsFile> metrics_;
  Saver saver_;
  const Schedule schedule_;
  Failures failures_;
  StopLine stop_line_;
  FaultInjector faults_;
  std::unique_ptr<Watchdog> watchdog_;  // last: its thread may call fail()
};

// The epoch's losses, test accuracy and training rate from stats summed over every
// rank (NaN test figures when nothing was evaluated).
void set_results(EpochMetrics& m, const StepStats& train, const StepStats& test);

// The norm of a step's reduced gradients, once the comm stream has drained: from the
// communicator's reduction pass where it keeps one, else a pass of the replica's own.
double reduced_grad_norm(Communicator& comm, Replica& replica);

// Waits for the device's streams to drain and swallows their errors: the failure
// has been recorded, and no queued work may outlive the buffers it uses.
void drain(Device& device) noexcept;

void train_ddp(Run& run);
void train_dp(Run& run);

}  // namespace mnist_mt
