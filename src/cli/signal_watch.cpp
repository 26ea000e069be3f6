#include "signal_watch.hpp"

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace mnist_mt {
namespace {

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

sigset_t block_stop_signals() {
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  return set;
}

const char* what_follows(StopRequest::Outcome outcome) {
  switch (outcome) {
    case StopRequest::Outcome::kEndBeforeTraining: return "ending before training starts (nothing to save yet)";
    case StopRequest::Outcome::kCheckpoint:
      return "stopping after the step in flight to save a checkpoint; again to abort";
    case StopRequest::Outcome::kNoCheckpoint:
      return "stopping after the step in flight, without a checkpoint (nowhere to save one); again to abort";
  }
  return "stopping";
}

}  // namespace

const char* signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

SignalWatch::SignalWatch(StopRequest& stop)
    : thread_([&stop, set = block_stop_signals()](std::stop_token token) {
        const timespec poll{0, 100'000'000};  // how soon the watch notices it should end
        bool first = true;
        while (!token.stop_requested()) {
          const int signal = sigtimedwait(&set, nullptr, &poll);
          if (signal < 0) continue;
          if (stop.exits_at_first_signal()) {  // the launcher ends the other processes
            std::fprintf(stderr, "mnist_mt: %s: this process ends now (one of several: no checkpoint)\n",
                         signal_name(signal));
            std::fflush(stdout);
            std::_Exit(128 + signal);
          }
          if (first) {
            stop.stop(signal, [signal](StopRequest::Outcome outcome) {
              std::fprintf(stderr, "mnist_mt: %s: %s\n", signal_name(signal), what_follows(outcome));
            });
            first = false;
          } else {
            stop.abort(signal);
          }
        }
      }) {}

}  // namespace mnist_mt
