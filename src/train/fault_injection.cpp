#include "fault_injection.hpp"

#include <chrono>
#include <limits>
#include <thread>

#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt {

void FaultInjector::fault(int rank, std::uint64_t step) const {
  const auto& f = faults_.fault;
  if (f && f->rank == first_rank_ + rank && f->step == step) throw RuntimeFailure("injected fault");
}

void FaultInjector::stall(int rank, std::uint64_t step, StallPhase phase) const {
  const auto& s = faults_.stall;
  if (!s || s->rank != first_rank_ + rank || s->step != step || s->phase != phase) return;
  // Stuck compute never returns; a missing peer or a stopped loader is released by the abort.
  while (phase == StallPhase::kCompute || !failures_.failed()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

bool FaultInjector::nan_at(int rank, std::uint64_t step) const {
  return faults_.nan && faults_.nan->rank == first_rank_ + rank && faults_.nan->step == step;
}

void FaultInjector::nan(int rank, std::uint64_t step, Replica& replica) {
  if (!nan_at(rank, step)) return;
  nan_clean_.resize(kParamCount);
  replica.read_params(nan_clean_);
  std::vector<float> poisoned = nan_clean_;
  // fc2's last bias: a NaN logit in every row, so a NaN loss and NaN gradients (earlier, a
  // ReLU's max(x, 0) may turn a NaN into 0).
  poisoned.back() = std::numeric_limits<float>::quiet_NaN();
  replica.write_params(poisoned);
}

void FaultInjector::undo_nan(int rank, std::uint64_t step, Replica& replica) {
  if (nan_at(rank, step)) replica.write_params(nan_clean_);
}

}  // namespace mnist_mt
