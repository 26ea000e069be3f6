#pragma once
// Errors that cross layer boundaries. The CLI maps them to exit codes:
// InputError -> 2 (bad input or usage), everything else -> 3 (runtime or distributed failure).
#include <stdexcept>
#include <string>
#include <utility>

namespace mnist_mt {

// Bad user input: a config value, a data file, a checkpoint. The message is one line
// that names the input and the problem.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  // A bad config value also carries its member's name ("batch", "sgd.lr", "save"), so
  // that a caller can say where the value came from (the CLI: the flag that gave it).
  InputError(const std::string& what, std::string input) : std::runtime_error(what), input_(std::move(input)) {}
  const std::string& input() const { return input_; }  // empty: not a config value

 private:
  std::string input_;
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
