#include "step_stats.hpp"

#include <cmath>
#include <utility>

#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {

bool StepStatsBook::admit(const UpdateGuard& guard, std::uint64_t number, double norm) {
  if (!halted_ && std::isfinite(norm) && std::isfinite(pending_.loss_sum)) {
    commit();
    return true;
  }
  ++sums_.skipped;
  // A halted replica's later steps are dropped whatever they hold.
  if (!halted_ && !sums_.non_finite)
    sums_.non_finite = NonFiniteStep{guard.first_step + number, pending_.loss_sum, norm};
  pending_ = {};
  halted_ = halted_ || guard.halt;
  return false;
}

void StepStatsBook::commit() {
  sums_.loss_sum += pending_.loss_sum;
  sums_.correct += pending_.correct;
  sums_.samples += pending_.samples;
  pending_ = {};
}

std::uint64_t StepStatsBook::snapshot(Stream& compute) {
  const std::uint64_t handle = taken_++;
  const std::size_t slot = handle % kSlots;
  tickets_[slot] = compute.enqueue([this, slot] {
    commit();
    snapshots_[slot] = std::exchange(sums_, StepStats{});
  });
  return handle;
}

std::optional<StepStats> StepStatsBook::read(Stream& compute, std::uint64_t handle, bool wait,
                                             const std::string& device) {
  if (handle >= taken_ || handle + kSlots <= taken_)
    throw RuntimeFailure(device + ": read_stats of snapshot " + std::to_string(handle) + ", not held");
  const std::size_t slot = handle % kSlots;
  if (!wait && !compute.passed(tickets_[slot])) return std::nullopt;
  compute.wait(tickets_[slot]);  // rethrows the stream's error
  return snapshots_[slot];
}

}  // namespace mnist_mt::cpu
