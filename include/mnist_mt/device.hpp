#pragma once
// A device as the trainer sees it: an in-order compute stream and an in-order comm
// stream (docs/architecture.md decisions 1 and 2). Replicas enqueue on the compute stream,
// communicators on the comm stream; these calls order one against the other, as CUDA
// events do, without blocking the host.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "mnist_mt/error.hpp"

namespace mnist_mt {

enum class Lane { kCompute, kComm };

enum class ReduceOp { kSum, kAverage };

// A point in a stream's work that other streams can wait for, without the host waiting
// (a CUDA event; a stream's ticket on CPU devices). Made by Device::make_event().
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};

// A moment in a stream's work, recorded by Device::mark().
struct TimeMark {
  Lane lane = Lane::kCompute;
  std::uint64_t id = 0;
};

// A step's work recorded once and run again by Device::replay() (docs/architecture.md decision 4):
// on GPUs a CUDA graph. Released before the device and its communicator.
class RecordedStep {
 public:
  virtual ~RecordedStep() = default;
  // The pieces of work a replay launches: a CUDA graph's nodes (kernels, copies, memsets,
  // event records and waits, collectives' kernels).
  virtual std::size_t nodes() const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // Binds the calling thread to this device (cudaSetDevice on GPUs). Every thread that
  // enqueues work for the device calls it first.
  virtual void activate() = 0;
  // Work enqueued on the comm stream from now on starts after all work enqueued on the
  // compute stream so far.
  virtual void comm_wait_compute() = 0;
  // Work enqueued on the compute stream from now on starts after all work enqueued on
  // the comm stream so far.
  virtual void compute_wait_comm() = 0;
  // Blocks the host until both streams are idle; rethrows the first error raised by
  // their work (Aborted if the device's communicator was aborted).
  virtual void synchronize() = 0;
  // Blocks the host until the compute stream is idle, leaving the comm stream running;
  // rethrows the compute stream's first error. The trainer times its phases with it.
  virtual void wait_compute() { synchronize(); }
  virtual std::string name() const = 0;  // "cpu:0", "cuda:1"

  // Enqueues on `lane` a record of the moment the device gets there (a CUDA event; the
  // stream thread's clock on CPU devices) and returns at once. Phases are timed this way,
  // and read later, so that a step never waits for the device to time itself.
  virtual TimeMark mark(Lane lane) = 0;
  // When the device passed `mark`, in seconds of the host's steady clock; nullopt while it
  // has not (never waits). Only the last kMarks marks of a device can be read. On GPUs it
  // is measured from the device's creation in float milliseconds: microseconds early on,
  // coarser hours later; durations come from elapsed().
  virtual std::optional<double> mark_time(const TimeMark& mark) = 0;
  // Seconds from `from` to `to`, once the device has passed both; nullopt before.
  virtual std::optional<double> elapsed(const TimeMark& from, const TimeMark& to) = 0;
  static constexpr std::size_t kMarks = 1024;

  // Events and the few operations a collective needs on the device (docs/architecture.md decision
  // 3; mnist_mt/local_group.hpp): a rank meets its peers on the host, and the devices
  // order the work by events already recorded, so no stream ever waits on the host.
  // Every call enqueues on `lane` and returns at once.
  virtual std::unique_ptr<DeviceEvent> make_event() = 0;
  // `event` is passed once the work enqueued on `lane` so far is done. Recording an event
  // again moves it: a wait enqueued before still waits for the earlier record.
  virtual void record(Lane lane, DeviceEvent& event) = 0;
  // Work enqueued on `lane` from now on starts once `event` is passed; `event` was made
  // by a device of the same backend in this process and has been recorded already.
  virtual void wait_for(Lane lane, const DeviceEvent& event) = 0;
  // out[j][i] = (((in[0][i] + in[1][i]) + in[2][i]) + ...) for i < count and every j, an
  // average divided by `divisor` (multiplied by its inverse when that is a power of two,
  // the same value): the CPU communicator's rank-order sum, bit for bit. The buffers are
  // the device's; an output may be an input.
  virtual void reduce(Lane lane, std::span<const float* const> in, std::span<float* const> out, std::size_t count,
                      ReduceOp op, std::size_t divisor) = 0;
  virtual void copy(Lane lane, float* to, const float* from, std::size_t count) = 0;

  // Recording (GPUs: CUDA graphs). Between begin_record() and end_record(), the work the
  // calling thread enqueues on the device's streams is recorded instead of run; mark()
  // calls are recorded too. Devices that cannot record say so here: CPU devices, GPUs
  // whose ranks share a GPU, and GPUs made with BackendOptions::cuda_graphs off.
  virtual bool can_record() const { return false; }
  virtual void begin_record() { throw RuntimeFailure(name() + ": this device does not record its work"); }
  // Ends the recording: the recorded work, or nullptr with `why` set when it could not
  // be recorded. The work was not run either way. A `why` already set (the caller failed
  // while enqueueing) ends the recording and drops it.
  virtual std::unique_ptr<RecordedStep> end_record(std::string& why) {
    if (why.empty()) why = name() + ": this device does not record its work";
    return nullptr;
  }
  // Enqueues the recorded work after the work enqueued so far, and returns at once. The
  // marks it records get new ids, which are written to `marks`, in the order the
  // recording made them; returns how many.
  virtual std::size_t replay(RecordedStep& /*step*/, std::span<TimeMark> /*marks*/) {
    throw RuntimeFailure(name() + ": this device does not record its work");
  }
};

}  // namespace mnist_mt
