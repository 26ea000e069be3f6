#pragma once
// Times a rank's training steps from marks on its device's streams (Device::mark), read
// once the device has passed them: a step never waits for the device to be timed. The
// phases are those of --metrics: forward (from the step's first work on the compute
// stream, its input included), backward, comm wait (the compute stream waiting for the
// comm stream before the update: exposed communication) and optimizer; each bucket's
// allreduce on the comm stream is traced too.
#include <array>
#include <cstdint>
#include <deque>
#include <utility>

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
  void end_forward() { open().forward = device_.mark(Lane::kCompute); }
  // At most one bucket per layer (buckets.hpp).
  void begin_allreduce() {
    Step& s = open();
    s.buckets[s.bucket_count++].first = device_.mark(Lane::kComm);
  }
  void end_allreduce() {
    Step& s = open();
    s.buckets[s.bucket_count - 1].second = device_.mark(Lane::kComm);
  }
  void end_backward() { open().backward = device_.mark(Lane::kCompute); }
  void end_comm_wait() { open().comm_wait = device_.mark(Lane::kCompute); }
  void end_step() { open().end = device_.mark(Lane::kCompute); }

  // Adds the phases of every step the device has passed to `into`; the others wait for
  // a later call. Never blocks.
  void harvest(PhaseSeconds& into);

 private:
  struct Step {
    std::uint64_t step = 0;
    double data_begin = 0, data_end = 0;
    TimeMark begin, forward, backward, comm_wait, end;
    // Fixed-size, so that a step allocates nothing for its timing.
    std::array<std::pair<TimeMark, TimeMark>, kLayers> buckets;
    std::size_t bucket_count = 0;
  };
  Step& open() { return steps_.back(); }
  void trace(const Step& s);

  Device& device_;
  const int rank_;
  TraceLog* trace_;
  std::deque<Step> steps_;  // enqueued, not yet harvested
};

}  // namespace mnist_mt
