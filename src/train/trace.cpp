#include "trace.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "mnist_mt/file_io.hpp"

namespace mnist_mt {
namespace {

constexpr const char* kLaneNames[] = {"compute stream", "comm stream", "host"};

}  // namespace

TraceLog::TraceLog(std::filesystem::path path, std::uint64_t first_step, std::uint64_t steps)
    : path_(std::move(path)), first_(first_step), steps_(steps) {}

void TraceLog::name_rank(int rank, const std::string& device) {
  std::lock_guard lock(mutex_);
  if (ranks_.size() <= static_cast<std::size_t>(rank)) ranks_.resize(rank + 1);
  ranks_[rank] = device;
}

void TraceLog::add(int rank, TraceLane lane, const char* name, double begin, double end, std::uint64_t step,
                   int bucket) {
  std::lock_guard lock(mutex_);
  events_.push_back({rank, lane, name, begin, end, step, bucket});
}

void TraceLog::write() const {
  std::lock_guard lock(mutex_);
  nlohmann::json events = nlohmann::json::array();
  // Timestamps in microseconds from the first event, so that the viewer opens on it.
  double origin = 0;
  if (!events_.empty())
    origin = std::min_element(events_.begin(), events_.end(), [](const Event& a, const Event& b) {
               return a.begin < b.begin;
             })->begin;
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r},
                      {"args", {{"name", "rank " + std::to_string(r) + " (" + ranks_[r] + ")"}}}});
    for (int lane = 0; lane < 3; ++lane)
      events.push_back(
          {{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", lane}, {"args", {{"name", kLaneNames[lane]}}}});
  }
  for (const Event& e : events_) {
    nlohmann::json args = {{"step", e.step}};
    if (e.bucket >= 0) args["bucket"] = e.bucket;
    events.push_back({{"ph", "X"},
                      {"name", e.name},
                      {"pid", e.rank},
                      {"tid", static_cast<int>(e.lane)},
                      {"ts", (e.begin - origin) * 1e6},
                      {"dur", std::max(0.0, e.end - e.begin) * 1e6},
                      {"args", args}});
  }
  const std::string text = nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n";
  write_file_atomically(path_, {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
}

}  // namespace mnist_mt
