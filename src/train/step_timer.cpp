#include "step_timer.hpp"

#include <optional>

namespace mnist_mt {

StepTimer::StepTimer(Device& device, int rank, TraceLog* trace) : device_(device), rank_(rank), trace_(trace) {
  if (trace_ != nullptr) trace_->name_rank(rank, device.name());
}

void StepTimer::begin(std::uint64_t step, double data_begin, double data_end) {
  Step& s = steps_.emplace_back();
  s.step = step;
  s.data_begin = data_begin;
  s.data_end = data_end;
  s.begin = device_.mark(Lane::kCompute);
}

void StepTimer::harvest(PhaseSeconds& into) {
  while (!steps_.empty()) {
    const Step& s = steps_.front();
    // The step's last mark: the compute stream passed the comm stream's marks before it.
    const std::optional<double> optimizer = device_.elapsed(s.comm_wait, s.end);
    if (!optimizer) return;
    into.forward += device_.elapsed(s.begin, s.forward).value_or(0);
    into.backward += device_.elapsed(s.forward, s.backward).value_or(0);
    into.comm_wait += device_.elapsed(s.backward, s.comm_wait).value_or(0);
    into.optimizer += *optimizer;
    if (trace_ != nullptr && trace_->wants(s.step)) trace(s);
    steps_.pop_front();
  }
}

void StepTimer::trace(const Step& s) {
  trace_->add(rank_, TraceLane::kHost, "data wait", s.data_begin, s.data_end, s.step);
  const auto span = [&](TraceLane lane, const char* name, const TimeMark& from, const TimeMark& to, int bucket) {
    const std::optional<double> a = device_.mark_time(from), b = device_.mark_time(to);
    if (a && b) trace_->add(rank_, lane, name, *a, *b, s.step, bucket);
  };
  span(TraceLane::kCompute, "forward", s.begin, s.forward, -1);
  span(TraceLane::kCompute, "backward", s.forward, s.backward, -1);
  span(TraceLane::kCompute, "comm wait", s.backward, s.comm_wait, -1);
  span(TraceLane::kCompute, "optimizer", s.comm_wait, s.end, -1);
  for (std::size_t b = 0; b < s.bucket_count; ++b)
    span(TraceLane::kComm, "allreduce", s.buckets[b].first, s.buckets[b].second, static_cast<int>(b));
}

}  // namespace mnist_mt
