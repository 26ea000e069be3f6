#include "watchdog.hpp"

#include <algorithm>
#include <tuple>

namespace mnist_mt {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);
// A poll this late means the whole process did not run (SIGSTOP, a suspended machine).
constexpr std::int64_t kLateNs = 2'000'000'000;

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kIdle: return "idle";
    case Phase::kData: return "data";
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kCommWait: return "comm wait";
    case Phase::kCollective: return "collective";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kEvaluate: return "evaluate";
    case Phase::kSave: return "save";
    case Phase::kDone: return "done";
  }
  return "unknown";
}

Watchdog::Watchdog(int ranks, double timeout_s, std::chrono::milliseconds grace, Hooks hooks)
    : ranks_(ranks),
      timeout_s_(timeout_s),
      grace_(grace),
      hooks_(std::move(hooks)),
      slots_(std::make_unique<Slot[]>(static_cast<std::size_t>(ranks))),
      thread_([this](std::stop_token stop) { watch(stop); }) {}

std::int64_t Watchdog::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Watchdog::beat(int rank, std::uint64_t step, Phase phase) {
  Slot& s = slots_[static_cast<std::size_t>(rank)];
  s.since_ns.store(now_ns(), std::memory_order_relaxed);
  s.step.store(step, std::memory_order_relaxed);
  s.phase.store(static_cast<int>(phase), std::memory_order_release);
}

// The rank furthest behind (step, then phase) is the one that holds the run: its peers
// wait for it further on in the same step, since a collective cannot finish without it.
// A peer can pass the timeout first (it waits from the moment it got there, which may be
// before the laggard even entered its phase), so the stall is reported only once the
// rank furthest behind has itself made no progress for the timeout, and it names that
// rank. The ranks are tied by every step's collectives, so while peers wait the rank
// furthest behind cannot keep moving: it too passes the timeout.
bool Watchdog::check_stall() {
  if (timeout_s_ <= 0) return false;
  const std::int64_t now = now_ns();
  int stalled = -1;
  std::tuple<std::uint64_t, int, std::int64_t> behind{};
  for (int r = 0; r < ranks_; ++r) {
    const Slot& s = slots_[static_cast<std::size_t>(r)];
    const int phase = s.phase.load(std::memory_order_acquire);
    const std::tuple<std::uint64_t, int, std::int64_t> at{s.step.load(std::memory_order_relaxed), phase,
                                                          s.since_ns.load(std::memory_order_relaxed)};
    if (phase == static_cast<int>(Phase::kIdle) || phase == static_cast<int>(Phase::kDone)) continue;
    if (stalled < 0 || at < behind) stalled = r, behind = at;
  }
  // Time this process spent stopped is no rank's stall, nor its peers' (whose messages
  // it could not take meanwhile): the clock restarts when it runs again.
  const std::int64_t since = std::max(std::get<2>(behind), resumed_ns_);
  // In seconds, as given: any finite timeout, however large, compares without overflow.
  const double waited_s = static_cast<double>(now - since) * 1e-9;
  if (stalled < 0 || waited_s <= timeout_s_) return false;
  hooks_.on_stall(stalled, std::get<0>(behind), static_cast<Phase>(std::get<1>(behind)), waited_s);
  return true;
}

void Watchdog::watch(std::stop_token stop) {
  std::unique_lock lock(mutex_);
  bool fired = false;
  while (!stop.stop_requested() && !fired) {
    wake_.wait_for(lock, stop, kPoll, [] { return false; });
    if (stop.stop_requested()) return;
    const std::int64_t now = now_ns();
    if (polled_ns_ != 0 && now - polled_ns_ > kLateNs) resumed_ns_ = now;
    polled_ns_ = now;
    fired = hooks_.tick() || check_stall();
  }
  wake_.wait_for(lock, stop, grace_, [] { return false; });
  if (!stop.stop_requested()) hooks_.on_hung();
}

}  // namespace mnist_mt
