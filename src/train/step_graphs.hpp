#pragma once
// A DDP rank's training step recorded once and replayed (docs/architecture.md decision 4): on GPUs
// one CUDA graph of everything the step enqueues after its input copy (forward, loss,
// backward, each bucket's allreduce on the comm stream, the guarded update). A recording
// freezes the values the step's calls were given, so it is replayed only under the same
// key; what changes from step to step lives on the device: the input (in the buffer
// set_input() filled, part of the key) with its epoch, which keys the dropout masks, the
// update's step and the updates applied (the replica counts them), and the schedule's
// learning rate and momentum (Replica::set_update_values). So a run records its first
// two steps, one per input buffer, or, where the replica gathers its planned rows itself
// (Replica::plan_epoch), its first step only. Every rank
// records, or none: whether a collective is captured must be the same on every rank of
// an NCCL communicator. The step's time marks are recorded in it only when its phases are
// wanted (TrainConfig::phase_times): otherwise a replay is one launch with no timing
// events inside, no graph is patched between replays, and the step is timed whole.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "mnist_mt/communicator.hpp"
#include "mnist_mt/device.hpp"
#include "mnist_mt/replica.hpp"
#include "step_timer.hpp"

namespace mnist_mt {

class StepGraphs {
 public:
  // What a recording of the step froze besides the run's constants (the SGD options, the
  // guard, the buckets).
  struct Key {
    std::uint32_t batch = 0;
    int input_buffer = 0;     // Replica::input_buffer()
    std::uint64_t seed = 0;   // the dropout key's; its epoch comes with the input
    bool operator==(const Key&) const = default;
  };

  // Records only where `device` can (not on CPU devices, nor with --no-cuda-graphs).
  // `phase_marks`: the step's time marks are recorded into its graph.
  StepGraphs(Device& device, Communicator& comm, bool phase_marks);

  // Runs one step: `enqueue` (its work after the input copy, marking `timer` as it goes)
  // enqueued as it is, or recorded under `key` the first time and replayed since. The
  // first rank whose recording fails says why in one warning, and every rank runs its
  // steps as they are enqueued from then on. Pass a lambda by std::ref: a step then
  // allocates nothing for it.
  void run(const Key& key, StepTimer& timer, const std::function<void()>& enqueue);

  // The nodes of the last recording (RecordedStep::nodes); 0 before one, and once steps
  // run as they are enqueued.
  std::size_t nodes() const { return graphs_.empty() ? 0 : graphs_.back().second->nodes(); }

 private:
  void replay(RecordedStep& graph, StepTimer& timer);

  Device& device_;
  Communicator& comm_;
  bool enabled_;
  const bool phase_marks_;
  std::vector<std::pair<Key, std::unique_ptr<RecordedStep>>> graphs_;
  std::array<TimeMark, StepTimer::kMaxMarks> marks_{};
};

}  // namespace mnist_mt
