#include "step_timer.hpp"

#include <algorithm>
#include <optional>
#include <string>

#include "mnist_mt/error.hpp"

namespace mnist_mt {

StepTimer::StepTimer(Device& device, int rank, TraceLog* trace) : device_(device), rank_(rank), trace_(trace) {
  if (trace_ != nullptr) trace_->name_rank(rank, device.name());
}

void StepTimer::begin(std::uint64_t step, double data_begin, double data_end) {
  Step& s = steps_.emplace_back();
  s.step = step;
  s.data_begin = data_begin;
  s.data_end = data_end;
  add(Lane::kCompute);
}

void StepTimer::add(Lane lane) {
  if (paused_) return;
  Step& s = open();
  if (s.count == kMaxMarks) throw RuntimeFailure("a step made more than " + std::to_string(kMaxMarks) + " time marks");
  s.marks[s.count++] = device_.mark(lane);
}

void StepTimer::begin_comm(CommKind what) {
  if (paused_) return;
  Step& s = open();
  if (s.count < 2 || s.count % 2 != 0)
    throw RuntimeFailure("a comm span began at time mark " + std::to_string(s.count) + " of its step");
  const std::size_t span = (s.count - 2) / 2;
  if (span == kMaxComm) throw RuntimeFailure("a step made more than " + std::to_string(kMaxComm) + " comm spans");
  s.exchanged[span] = what;
  add(Lane::kComm);
}

void StepTimer::replayed(std::span<const TimeMark> marks) {
  if (marks.empty()) return replayed_whole();
  Step& s = open();
  if (s.count + marks.size() > kMaxMarks)
    throw RuntimeFailure("a replayed step made more than " + std::to_string(kMaxMarks) + " time marks");
  std::copy(marks.begin(), marks.end(), s.marks.begin() + static_cast<std::ptrdiff_t>(s.count));
  s.count += marks.size();
}

void StepTimer::replayed_whole() {
  if (open().count != 1)
    throw RuntimeFailure("a step timed whole made " + std::to_string(open().count) + " time marks before its end, not 1");
  add(Lane::kCompute);
}

void StepTimer::harvest(PhaseSeconds& into) {
  while (!steps_.empty()) {
    const Step& s = steps_.front();
    if (s.count == 2) {  // timed whole (replayed_whole)
      const std::optional<double> whole = device_.elapsed(s.marks[0], s.marks[1]);
      if (!whole) return;
      into.replayed += *whole;  // traced steps are timed by phase (Run: a trace implies phase_times)
      steps_.pop_front();
      continue;
    }
    if (s.count < 5)
      throw RuntimeFailure("a timed step made " + std::to_string(s.count) + " time marks, not 2 or 5 or more");
    // The step's last mark: the compute stream passed the comm stream's marks before it.
    const std::optional<double> optimizer = device_.elapsed(s.from_end(1), s.from_end(0));
    if (!optimizer) return;
    into.forward += device_.elapsed(s.marks[0], s.marks[1]).value_or(0);
    into.backward += device_.elapsed(s.marks[1], s.from_end(2)).value_or(0);
    into.comm_wait += device_.elapsed(s.from_end(2), s.from_end(1)).value_or(0);
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
  span(TraceLane::kCompute, "forward", s.marks[0], s.marks[1], -1);
  span(TraceLane::kCompute, "backward", s.marks[1], s.from_end(2), -1);
  span(TraceLane::kCompute, "comm wait", s.from_end(2), s.from_end(1), -1);
  span(TraceLane::kCompute, "optimizer", s.from_end(1), s.from_end(0), -1);
  int bucket = 0;
  for (std::size_t k = 0; k < s.comm_spans(); ++k) {
    const TimeMark &from = s.marks[2 + 2 * k], &to = s.marks[3 + 2 * k];
    switch (s.exchanged[k]) {
      case CommKind::kAllreduce: span(TraceLane::kComm, "allreduce", from, to, bucket++); break;
      case CommKind::kFc1Input: span(TraceLane::kComm, "allgather fc1 input", from, to, -1); break;
      case CommKind::kFc1OutputGrad: span(TraceLane::kComm, "allgather fc1 output gradient", from, to, -1); break;
    }
  }
}

}  // namespace mnist_mt
