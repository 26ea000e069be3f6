#pragma once
// Errors that cross layer boundaries. The CLI maps them to exit codes:
// InputError -> 2 (bad input or usage), everything else -> 3 (runtime or distributed failure).
#include <stdexcept>
#include <string>

namespace mnist_mt {

// Bad user input: a flag, a data file, a checkpoint. The message is one line that
// names the input and the problem.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failure while running: a library call, a device, a worker thread.
class RuntimeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective or stream operation released because the group was aborted
// (a peer failed). Never the root cause: the trainer reports the first other error.
class Aborted : public RuntimeFailure {
 public:
  using RuntimeFailure::RuntimeFailure;
};

// The run was aborted by a signal; the CLI exits 128 + signal.
class Interrupted : public RuntimeFailure {
 public:
  Interrupted(const std::string& what, int signal) : RuntimeFailure(what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

}  // namespace mnist_mt
