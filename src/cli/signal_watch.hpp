#pragma once
// Turns SIGINT and SIGTERM into stop requests: the first asks the run to stop after
// the step in flight and save (before training starts, to end: StopRequest::Outcome,
// which its message tells), the second to abort at once. SIGHUP and SIGPIPE are
// ignored, so a run whose terminal or pipe closes keeps training (its writes to the
// closed stream fail quietly).
#include <thread>

#include "mnist_mt/trainer.hpp"

namespace mnist_mt {

class SignalWatch {
 public:
  // Blocks SIGINT and SIGTERM in the calling thread, and so in every thread made after
  // it: make it first in main. A thread of its own takes them with sigtimedwait.
  explicit SignalWatch(StopRequest& stop);
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

 private:
  std::jthread thread_;
};

const char* signal_name(int signal);

}  // namespace mnist_mt
