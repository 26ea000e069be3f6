#pragma once
// The failure and stop protocol of a run's ranks. The first failure recorded releases
// every peer (the communicators abort, the loaders cancel) and is the one reported; a stop
// request ends every rank at the same global step.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "mnist_mt/error.hpp"

namespace mnist_mt {

// A failure that belongs to a step other than the one its rank had reached: a non-finite
// step read from the device's stats some steps later.
class StepFailure : public RuntimeFailure {
 public:
  StepFailure(std::uint64_t step, const std::string& what) : RuntimeFailure(what), step_(step) {}
  std::uint64_t step() const { return step_; }

 private:
  std::uint64_t step_;
};

// A rank held up by other processes that sent nothing for --timeout: reported with those
// processes as its subject, not as "rank R failed".
class ProcessesSilent : public RuntimeFailure {
 public:
  using RuntimeFailure::RuntimeFailure;
};

class Failures {
 public:
  // `ranks` of this process, the first of which is world rank `first_rank`; `host`
  // names this process in reports across processes (empty: one process). `release`
  // frees every rank that waits (any thread, after each failure recorded).
  Failures(int ranks, int first_rank, std::string host, std::function<void()> release);

  // Any thread: records a failure of this process's rank `rank` (-1: of none) at global
  // step `step` and releases every peer.
  void fail(int rank, std::uint64_t step, std::exception_ptr error);
  bool failed() const { return failed_.load(); }
  // A worker, once its replica is ready: returns when every rank's is, or throws
  // Aborted once a rank has failed.
  void await_peers();
  // A rank that leaves the report of a failure to another: returns once one is recorded
  // (no abort could then turn it into an Aborted of its own).
  void await_report();
  // Main thread, after the workers joined: throws the first failure that is not Aborted
  // as "rank R failed at step S: why" (R the world rank; "rank R (host H)" across
  // processes). Returns when nothing failed.
  void rethrow() const;

 private:
  struct Failure {
    int rank;
    std::uint64_t step;
    std::exception_ptr error;
  };
  const int ranks_;
  const int first_rank_;
  const std::string host_;
  const std::function<void()> release_;
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;  // guards failures_ and ready_
  std::condition_variable cv_;
  std::vector<Failure> failures_;
  int ready_ = 0;  // ranks through await_peers()
};

// Where a stop request (the first SIGINT or SIGTERM) ends the ranks' training: every
// rank checks before each step; the first to see the request sets the stop one step past
// the furthest any rank has started, or before the step it checks when none has started
// that one (a request between steps, such as during an epoch's evaluation, takes no step
// more). Hosts run ahead of their devices, and so of each other, but none past a step
// that every rank will start.
class StopLine {
 public:
  explicit StopLine(int ranks) : started_(static_cast<std::size_t>(ranks), 0) {}
  // Whether `rank` stops before global step `step`; `requested`: a stop was asked for.
  bool stop_before(int rank, std::uint64_t step, bool requested);

 private:
  static constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
  std::mutex mutex_;  // guards stop_at_ and started_
  std::uint64_t stop_at_ = kNever;
  std::vector<std::uint64_t> started_;  // per rank: 1 + the step it last went on to (0: none)
};

}  // namespace mnist_mt
