#pragma once
// The stall watchdog: every rank reports the phase of the step it is in; a rank that
// stays in one phase longer than the timeout is reported once, from the watchdog's own
// thread, so that a rank stuck in compute, in a collective no peer joins, or waiting for
// a loader that stopped cannot hold the run forever.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace mnist_mt {

// In the order a step goes through them: kCollective is joining the step's allreduces,
// kCommWait waiting for them to finish.
enum class Phase : int {
  kIdle, kData, kForward, kCollective, kBackward, kCommWait, kOptimizer, kEvaluate, kSave, kDone
};

const char* phase_name(Phase phase);

class Watchdog {
 public:
  // on_stall(rank, step, phase, seconds): once, when a rank has been in `phase` of `step`
  // for longer than timeout_s (0: never). tick(): every poll, for other requests (an
  // abort). on_hung(): when, after on_stall or tick returned true, the run has not ended
  // within `grace` (a thread that cannot be released).
  struct Hooks {
    std::function<void(int rank, std::uint64_t step, Phase phase, double seconds)> on_stall;
    std::function<bool()> tick;
    std::function<void()> on_hung;
  };
  Watchdog(int ranks, double timeout_s, std::chrono::milliseconds grace, Hooks hooks);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Rank `rank` enters `phase` of global step `step`; kIdle and kDone are never stalls.
  void beat(int rank, std::uint64_t step, Phase phase);

 private:
  struct Slot {
    std::atomic<std::int64_t> since_ns{0};
    std::atomic<std::uint64_t> step{0};
    std::atomic<int> phase{static_cast<int>(Phase::kIdle)};
  };
  static std::int64_t now_ns();
  void watch(std::stop_token stop);
  bool check_stall();

  const int ranks_;
  const double timeout_s_;
  const std::chrono::milliseconds grace_;
  const Hooks hooks_;
  std::unique_ptr<Slot[]> slots_;
  // The watch's own last poll, and when it last found itself late by far (the process
  // was stopped or suspended): no rank is blamed for that time (watch thread only).
  std::int64_t polled_ns_ = 0;
  std::int64_t resumed_ns_ = 0;
  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::jthread thread_;  // last: starts once the rest is made, stopped and joined first
};

}  // namespace mnist_mt
