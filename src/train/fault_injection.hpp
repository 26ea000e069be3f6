#pragma once
// Where the faults of TrainConfig::faults (include/mnist_mt/faults.hpp) strike: the loops
// call these at each step's points, and they act only at the injected rank and step.
#include <cstdint>
#include <vector>

#include "failures.hpp"
#include "mnist_mt/faults.hpp"
#include "mnist_mt/replica.hpp"

namespace mnist_mt {

class FaultInjector {
 public:
  // This process's ranks start at world rank `first_rank`; a stall waits on `failures`.
  FaultInjector(const Faults& faults, int first_rank, const Failures& failures)
      : faults_(faults), first_rank_(first_rank), failures_(failures) {}

  // Throws the injected fault when `rank` starts global step `step`.
  void fault(int rank, std::uint64_t step) const;
  // Never returns (or, for the data and collective phases, returns once the run has
  // failed) when `rank` reaches `phase` of the injected stall's step.
  void stall(int rank, std::uint64_t step, StallPhase phase) const;
  // When `rank` starts the injected NaN's step, one of its replica's parameters turns NaN
  // (and so its loss and gradients) until undo_nan() at the step's end writes them back
  // as they were. One rank's thread only calls these.
  void nan(int rank, std::uint64_t step, Replica& replica);
  void undo_nan(int rank, std::uint64_t step, Replica& replica);

 private:
  bool nan_at(int rank, std::uint64_t step) const;

  const Faults faults_;
  const int first_rank_;
  const Failures& failures_;
  std::vector<float> nan_clean_;  // the injected NaN's rank's parameters before it
};

}  // namespace mnist_mt
