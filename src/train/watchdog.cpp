#include "watchdog.hpp"

namespace mnist_mt {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kIdle: return "idle";
    case Phase::kData: return "data";
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
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

// The rank that has waited longest is the one that stalled: its peers entered their
// wait (a collective) after it stopped.
bool Watchdog::check_stall() {
  if (timeout_s_ <= 0) return false;
  const std::int64_t now = now_ns();
  int oldest = -1;
  std::int64_t oldest_since = now;
  for (int r = 0; r < ranks_; ++r) {
    const Slot& s = slots_[static_cast<std::size_t>(r)];
    const auto phase = static_cast<Phase>(s.phase.load(std::memory_order_acquire));
    const std::int64_t since = s.since_ns.load(std::memory_order_relaxed);
    if (phase == Phase::kIdle || phase == Phase::kDone) continue;
    if (since < oldest_since) oldest = r, oldest_since = since;
  }
  const double seconds = static_cast<double>(now - oldest_since) * 1e-9;
  if (oldest < 0 || seconds <= timeout_s_) return false;
  const Slot& s = slots_[static_cast<std::size_t>(oldest)];
  hooks_.on_stall(oldest, s.step.load(), static_cast<Phase>(s.phase.load()), seconds);
  return true;
}

void Watchdog::watch(std::stop_token stop) {
  std::unique_lock lock(mutex_);
  bool fired = false;
  while (!stop.stop_requested() && !fired) {
    wake_.wait_for(lock, stop, kPoll, [] { return false; });
    if (stop.stop_requested()) return;
    fired = hooks_.tick() || check_stall();
  }
  wake_.wait_for(lock, stop, grace_, [] { return false; });
  if (!stop.stop_requested()) hooks_.on_hung();
}

}  // namespace mnist_mt
