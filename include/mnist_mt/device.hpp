#pragma once
// A device as the trainer sees it: an in-order compute stream and an in-order comm
// stream (DESIGN.md decisions 1 and 2). Replicas enqueue on the compute stream,
// communicators on the comm stream; these calls order one against the other, as CUDA
// events do, without blocking the host.
#include <string>

namespace mnist_mt {

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
};

}  // namespace mnist_mt
