#pragma once
// A CPU replica's step statistics. On the compute thread: the forwards since the last
// update (pending) and those of updated steps and evaluation (committed), the decision of
// a guarded update, the snapshots. On the host: the ring of snapshot handles, read back
// through the compute stream's tickets.
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "mnist_mt/replica.hpp"
#include "stream.hpp"

namespace mnist_mt::cpu {

class StepStatsBook {
 public:
  // Compute thread.
  void add_forward(double loss_sum, double correct, std::uint32_t rows) {
    pending_.loss_sum += loss_sum;
    pending_.correct += correct;
    pending_.samples += rows;
  }
  // Guarded update number `number` (from the guard's first step) with the reduced
  // gradients' norm: true, the pending stats committed, when the update applies; else
  // the step is dropped and recorded (the first non-finite one), and with the guard's
  // halt every later one is dropped too.
  bool admit(const UpdateGuard& guard, std::uint64_t number, double norm);
  void commit();

  // Host: a snapshot of the committed stats, taken on `compute` after the work queued so
  // far; read_stats() of its handle waits for it (or, without `wait`, returns nothing
  // while it has not been taken). `device` names the replica's device in errors.
  std::uint64_t snapshot(Stream& compute);
  std::optional<StepStats> read(Stream& compute, std::uint64_t handle, bool wait, const std::string& device);

 private:
  static constexpr std::uint64_t kSlots = Replica::kSnapshots;
  // Compute thread.
  StepStats sums_;     // committed: the forwards of updated steps, and evaluation's
  StepStats pending_;  // the forwards since the last update, until it is applied or dropped
  bool halted_ = false;
  std::array<StepStats, kSlots> snapshots_;
  // Host.
  std::array<std::uint64_t, kSlots> tickets_{};
  std::uint64_t taken_ = 0;
};

}  // namespace mnist_mt::cpu
