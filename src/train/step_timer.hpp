#pragma once
// Times a rank's training steps from marks on its device's streams (Device::mark), read
// once the device has passed them: a step never waits for the device to be timed. The
// phases are those of --metrics: forward (from the step's first work on the compute
// stream, its input included), backward, comm wait (the compute stream waiting for the
// comm stream before the update: exposed communication) and optimizer; each bucket's
// allreduce and, with --exchange factors, each allgather of fc1's factors on the comm
// stream are traced too. A recorded step's replay gives the same marks (Device::replay),
// or, where the step was recorded with its marks left out (StepGraphs: without
// TrainConfig::phase_times), a step is timed whole: from its begin mark to one made
// after its replay, both outside the recording (PhaseSeconds::replayed).
#include <array>
#include <cstdint>
#include <deque>
#include <span>

#include "mnist_mt/device.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/trainer.hpp"
#include "trace.hpp"

namespace mnist_mt {

class StepTimer {
 public:
  // `trace` may be null.
  StepTimer(Device& device, int rank, TraceLog* trace);

  // A step's marks, in the order its work is enqueued. `data_begin`/`data_end`: the
  // host's wait for the batch, steady-clock seconds (traced; the caller times it).
  void begin(std::uint64_t step, double data_begin, double data_end);
  void end_forward() { add(Lane::kCompute); }
  // What a span on the comm stream exchanges: a bucket's gradients (at most one bucket per
  // layer: buckets.hpp), or fc1's input or output gradient (--exchange factors).
  enum class CommKind : std::uint8_t { kAllreduce, kFc1Input, kFc1OutputGrad };
  void begin_comm(CommKind what);
  void end_comm() { add(Lane::kComm); }
  void end_backward() { add(Lane::kCompute); }
  void end_comm_wait() { add(Lane::kCompute); }
  void end_step() { add(Lane::kCompute); }

  // A recorded step (step_graphs.hpp): the marks made while its work was recorded will
  // never be passed, and are dropped (those after the first `count` of the open step);
  // replayed() takes the marks its replay records instead, in the same order (none: the
  // step is timed whole, replayed_whole()).
  std::size_t marks() { return open().count; }
  void drop_marks_after(std::size_t count) { open().count = count; }
  void replayed(std::span<const TimeMark> marks);
  // While paused, the step's marks and comm spans are not made: a recording made then
  // holds no timing events. A step whose replay made no marks is ended by
  // replayed_whole(), one mark after the replay.
  void pause(bool paused) { paused_ = paused; }
  void replayed_whole();

  // Adds the phases of every step the device has passed to `into`; the others wait for
  // a later call. Never blocks.
  void harvest(PhaseSeconds& into);

  // The most marks a step makes: begin, forward, two per bucket and per allgather (two),
  // backward, comm wait, end.
  static constexpr std::size_t kMaxComm = kLayers + 2;
  static constexpr std::size_t kMaxMarks = 5 + 2 * kMaxComm;

 private:
  // marks[0] begin, [1] forward, then each comm span's begin and end (what it exchanges in
  // `exchanged`, in the same order), and the last three backward, comm wait and end.
  struct Step {
    std::uint64_t step = 0;
    double data_begin = 0, data_end = 0;
    // Fixed-size, so that a step allocates nothing for its timing.
    std::array<TimeMark, kMaxMarks> marks;
    // A replayed step's stay allreduces: factors are CPU-only, and CPU devices record no steps.
    std::array<CommKind, kMaxComm> exchanged{};
    std::size_t count = 0;
    std::size_t comm_spans() const { return (count - 5) / 2; }
    const TimeMark& from_end(std::size_t k) const { return marks[count - 1 - k]; }
  };
  Step& open() { return steps_.back(); }
  void add(Lane lane);
  void trace(const Step& s);

  Device& device_;
  const int rank_;
  TraceLog* trace_;
  std::deque<Step> steps_;  // enqueued, not yet harvested
  bool paused_ = false;
};

}  // namespace mnist_mt
