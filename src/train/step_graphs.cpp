#include "step_graphs.hpp"

#include <algorithm>
#include <exception>
#include <iostream>
#include <span>
#include <string>

namespace mnist_mt {

StepGraphs::StepGraphs(Device& device, Communicator& comm, bool phase_marks)
    : device_(device), comm_(comm), enabled_(device.can_record()), phase_marks_(phase_marks) {}

void StepGraphs::run(const Key& key, StepTimer& timer, const std::function<void()>& enqueue) {
  if (!enabled_) {
    enqueue();
    return;
  }
  for (auto& [k, graph] : graphs_) {
    if (k == key) {
      replay(*graph, timer);
      return;
    }
  }
  const std::size_t marked = timer.marks();  // before the step's work
  device_.begin_record();
  std::string why;
  timer.pause(!phase_marks_);
  try {
    enqueue();
  } catch (const std::exception& e) {  // an Aborted peer reaches this rank again below
    why = e.what();
    if (why.empty()) why = "a call failed while the step was recorded";
  }
  timer.pause(false);
  std::unique_ptr<RecordedStep> graph = device_.end_record(why);
  timer.drop_marks_after(marked);  // the recording's marks are never passed

  std::vector<double> failed(static_cast<std::size_t>(comm_.size()), 0.0);
  failed[static_cast<std::size_t>(comm_.rank())] = graph ? 0.0 : 1.0;
  device_.comm_wait_compute();  // after every collective the steps before have launched
  comm_.allreduce_host(failed);
  const auto first_failed = std::find(failed.begin(), failed.end(), 1.0);
  if (first_failed != failed.end()) {
    enabled_ = false;
    graphs_.clear();
    if (first_failed - failed.begin() == comm_.rank())
      std::cerr << "mnist_mt: warning: " << device_.name()
                << ": CUDA graphs off, every rank runs its steps as they are enqueued: " << why << "\n";
    enqueue();
    return;
  }
  graphs_.emplace_back(key, std::move(graph));
  replay(*graphs_.back().second, timer);
}

void StepGraphs::replay(RecordedStep& graph, StepTimer& timer) {
  timer.replayed(std::span<const TimeMark>(marks_.data(), device_.replay(graph, marks_)));
}

}  // namespace mnist_mt
