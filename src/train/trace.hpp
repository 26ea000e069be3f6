#pragma once
// --trace: a Chrome trace-event JSON (chrome://tracing, Perfetto) of the first steps of a
// run, one process per rank with a thread per lane (its compute and comm streams, and
// the host thread's data wait), from the same marks the phase times come from.
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace mnist_mt {

enum class TraceLane : int { kCompute, kComm, kHost };

class TraceLog {
 public:
  // `steps`: how many steps, from the run's first, are traced.
  TraceLog(std::filesystem::path path, std::uint64_t first_step, std::uint64_t steps);
  bool wants(std::uint64_t step) const { return step >= first_ && step - first_ < steps_; }
  // Any thread. Seconds are on the host's steady clock.
  void name_rank(int rank, const std::string& device);
  // `name` is a literal; `bucket`, for an allreduce, its gradient bucket.
  void add(int rank, TraceLane lane, const char* name, double begin, double end, std::uint64_t step,
           int bucket = -1);
  // Writes the file (atomically: a temp file renamed); InputError naming it when it cannot.
  void write() const;

 private:
  struct Event {
    int rank;
    TraceLane lane;
    const char* name;
    double begin, end;
    std::uint64_t step;
    int bucket;
  };

  std::filesystem::path path_;
  std::uint64_t first_, steps_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  std::vector<std::string> ranks_;  // device of each rank seen
};

}  // namespace mnist_mt
