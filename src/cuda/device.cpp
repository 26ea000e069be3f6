#include "device.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <iostream>
#include <optional>
#include <thread>

#include "errors.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cuda {
namespace {

int make_current(int id) {
  CUDA_CHECK(cudaSetDevice(id));
  return id;
}

int highest_priority() {
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return greatest;
}

}  // namespace

CudaDevice::CudaDevice(int id)
    : id_(make_current(id)),
      compute_(make_stream(0)),
      comm_(make_stream(highest_priority())),
      copy_(make_stream(0)),
      compute_mark_(cuda::make_event()),
      comm_mark_(cuda::make_event()),
      origin_(make_timing_event()) {
  marks_.reserve(kMarks);
  for (std::size_t i = 0; i < kMarks; ++i) marks_.push_back(make_timing_event());
  // The host clock is read once the origin has been passed, so device times land on it
  // within the synchronisation's latency.
  CUDA_CHECK(cudaEventRecord(origin_.get(), compute_.get()));
  CUDA_CHECK(cudaEventSynchronize(origin_.get()));
  origin_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

CudaDevice::~CudaDevice() {
  // Streams and events are released on their own device.
  cudaSetDevice(id_);
}

void CudaDevice::activate() { CUDA_CHECK(cudaSetDevice(id_)); }

void CudaDevice::comm_wait_compute() {
  CUDA_CHECK(cudaEventRecord(compute_mark_.get(), compute_.get()));
  CUDA_CHECK(cudaStreamWaitEvent(comm_.get(), compute_mark_.get(), 0));
}

void CudaDevice::compute_wait_comm() {
  CUDA_CHECK(cudaEventRecord(comm_mark_.get(), comm_.get()));
  CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), comm_mark_.get(), 0));
}

TimeMark CudaDevice::mark(Lane lane) {
  const TimeMark m{lane, marks_taken_++};
  cudaEvent_t event = marks_[m.id % kMarks].get();
  record_event(event, lane == Lane::kCompute ? compute_.get() : comm_.get());
  if (recording_) {
    recorded_marks_.push_back(event);
    recorded_lanes_.push_back(lane);
  }
  return m;
}

void CudaDevice::record_event(cudaEvent_t event, cudaStream_t stream) const {
  // The external flag is refused outside a capture.
  CUDA_CHECK(cudaEventRecordWithFlags(event, stream, recording_ ? cudaEventRecordExternal : cudaEventRecordDefault));
}

namespace {

struct GraphRelease {
  void operator()(cudaGraph_t g) const noexcept { cudaGraphDestroy(g); }
};
struct GraphExecRelease {
  void operator()(cudaGraphExec_t g) const noexcept { cudaGraphExecDestroy(g); }
};

// An instantiated graph, with the template it came from: its mark nodes are the
// template's nodes, retargeted in the instance before each launch.
class CudaRecordedStep final : public RecordedStep {
 public:
  CudaRecordedStep(int device, Owner<cudaGraph_t, GraphRelease> graph, Owner<cudaGraphExec_t, GraphExecRelease> exec,
                   std::vector<cudaGraphNode_t> mark_nodes, std::vector<Lane> lanes, std::size_t nodes)
      : device_(device),
        graph_(std::move(graph)),
        exec_(std::move(exec)),
        nodes_(nodes),
        mark_nodes_(std::move(mark_nodes)),
        lanes_(std::move(lanes)) {}
  ~CudaRecordedStep() override { cudaSetDevice(device_); }  // released on its device

  cudaGraphExec_t exec() const { return exec_.get(); }
  std::size_t nodes() const override { return nodes_; }
  const std::vector<cudaGraphNode_t>& mark_nodes() const { return mark_nodes_; }
  const std::vector<Lane>& lanes() const { return lanes_; }

 private:
  int device_;
  Owner<cudaGraph_t, GraphRelease> graph_;
  Owner<cudaGraphExec_t, GraphExecRelease> exec_;
  std::size_t nodes_;
  std::vector<cudaGraphNode_t> mark_nodes_;  // in the order mark() made them
  std::vector<Lane> lanes_;
};

std::vector<cudaGraphNode_t> graph_nodes(cudaGraph_t graph) {
  std::size_t count = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  nodes.resize(count);
  return nodes;
}

// The event record nodes of `events` among `nodes`, in the events' order; empty when one
// is missing.
std::vector<cudaGraphNode_t> nodes_recording(const std::vector<cudaGraphNode_t>& nodes,
                                             const std::vector<cudaEvent_t>& events) {
  std::vector<cudaGraphNode_t> found(events.size(), nullptr);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeEventRecord) continue;
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaGraphEventRecordNodeGetEvent(node, &event));
    const auto at = std::find(events.begin(), events.end(), event);
    if (at != events.end()) found[static_cast<std::size_t>(at - events.begin())] = node;
  }
  if (std::find(found.begin(), found.end(), nullptr) != found.end()) return {};
  return found;
}

}  // namespace

void CudaDevice::begin_record() {
  if (!record_allowed_) throw RuntimeFailure(name() + ": its steps may not be recorded");
  if (recording_) throw RuntimeFailure(name() + ": begin_record() while recording");
  recorded_marks_.clear();
  recorded_lanes_.clear();
  CUDA_CHECK(cudaStreamBeginCapture(compute_.get(), cudaStreamCaptureModeThreadLocal));
  recording_ = true;
}

std::unique_ptr<RecordedStep> CudaDevice::end_record(std::string& why) {
  if (!recording_) throw RuntimeFailure(name() + ": end_record() without begin_record()");
  recording_ = false;
  cudaGraph_t raw = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(compute_.get(), &raw);
  Owner<cudaGraph_t, GraphRelease> graph(raw);
  if (!why.empty()) {
    cudaGetLastError();  // the failed capture's error, reported through `why`
    return nullptr;
  }
  if (ended != cudaSuccess) {
    why = std::string("capture failed: ") + cudaGetErrorString(ended);
    cudaGetLastError();
    return nullptr;
  }
  const std::vector<cudaGraphNode_t> all = graph_nodes(graph.get());
  std::vector<cudaGraphNode_t> nodes = nodes_recording(all, recorded_marks_);
  if (nodes.size() != recorded_marks_.size()) {
    why = "the graph lacks a time mark's event record";
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph.get(), 0);
  if (made != cudaSuccess) {
    why = std::string("graph instantiation failed: ") + cudaGetErrorString(made);
    cudaGetLastError();
    return nullptr;
  }
  return std::make_unique<CudaRecordedStep>(id_, std::move(graph), Owner<cudaGraphExec_t, GraphExecRelease>(exec),
                                            std::move(nodes), recorded_lanes_, all.size());
}

std::size_t CudaDevice::replay(RecordedStep& step, std::span<TimeMark> marks) {
  // An abort that lands after this check is harmless: NCCL frees no communicator while a
  // graph holding its collectives lives, and the launched kernels see its abort flag.
  throw_if_aborted();
  auto* recorded = dynamic_cast<CudaRecordedStep*>(&step);
  if (recorded == nullptr) throw RuntimeFailure(name() + ": replay of a step another kind of device recorded");
  const std::vector<cudaGraphNode_t>& nodes = recorded->mark_nodes();
  if (marks.size() < nodes.size())
    throw RuntimeFailure(name() + ": replay of a step with " + std::to_string(nodes.size()) + " marks into " +
                         std::to_string(marks.size()));
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    marks[i] = TimeMark{recorded->lanes()[i], marks_taken_++};
    CUDA_CHECK(cudaGraphExecEventRecordNodeSetEvent(recorded->exec(), nodes[i], marks_[marks[i].id % kMarks].get()));
  }
  CUDA_CHECK(cudaGraphLaunch(recorded->exec(), compute_.get()));
  return nodes.size();
}

namespace {

bool passed(cudaEvent_t event) {
  const cudaError_t state = cudaEventQuery(event);
  if (state == cudaErrorNotReady) return false;
  CUDA_CHECK(state);
  return true;
}

double seconds_between(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
  return ms / 1e3;
}

}  // namespace

std::optional<double> CudaDevice::mark_time(const TimeMark& m) {
  cudaEvent_t event = marks_[m.id % kMarks].get();
  if (!passed(event)) return std::nullopt;
  return origin_seconds_ + seconds_between(origin_.get(), event);
}

std::optional<double> CudaDevice::elapsed(const TimeMark& from, const TimeMark& to) {
  cudaEvent_t a = marks_[from.id % kMarks].get(), b = marks_[to.id % kMarks].get();
  if (!passed(a) || !passed(b)) return std::nullopt;
  return seconds_between(a, b);
}

void CudaDevice::synchronize() {
  // Every stream drains even when one has failed; an abort explains whatever failed.
  std::exception_ptr first;
  for (cudaStream_t s : {compute_.get(), copy_.get(), comm_.get()}) {
    try {
      wait_stream(s);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  throw_if_aborted();
  if (first) std::rethrow_exception(first);
}

void CudaDevice::wait_compute() {
  wait_stream(compute_.get());
  throw_if_aborted();
}

template <class Query>
bool CudaDevice::wait_until(Query&& query, std::chrono::steady_clock::time_point deadline) const {
  using Clock = std::chrono::steady_clock;
  std::exception_ptr failure;                 // the group's, rethrown once the work has drained
  std::optional<Clock::time_point> drain_by;  // once the wait has seen the abort
  for (int polls = 0;; ++polls) {
    const cudaError_t state = query();
    if (state == cudaSuccess) break;
    if (state != cudaErrorNotReady) CUDA_CHECK(state);
    if (check_group_ && !drain_by) {
      try {
        check_group_();
      } catch (...) {
        if (!group_aborted()) throw;
        failure = std::current_exception();  // it aborted the group: drain first
      }
    }
    const Clock::time_point now = Clock::now();
    if (!drain_by && group_aborted()) drain_by = now + kDrainAfterAbort;
    if (drain_by) {
      if (wedged() || now >= *drain_by) {  // wedged: an earlier wait has given up already
        if (!wedged_.exchange(true, std::memory_order_acq_rel)) {
          keep_memory_from_now();
          std::cerr << ("mnist_mt: warning: " + name() + ": work still runs " +
                        std::to_string(kDrainAfterAbort.count()) +
                        " s after its communicator group was aborted; device memory is left allocated from now on\n");
        }
        break;
      }
    } else if (now >= deadline) {
      return false;
    }
    pause_between_polls(polls);
  }
  if (failure) std::rethrow_exception(failure);
  if (drain_by) throw_if_aborted();
  return true;
}

void pause_between_polls(int polls) {
  using namespace std::chrono_literals;
  if (polls < 100) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(50us);
  }
}

void CudaDevice::wait_stream(cudaStream_t stream) const {
  wait_stream_until(stream, std::chrono::steady_clock::time_point::max());
}

bool CudaDevice::wait_stream_until(cudaStream_t stream, std::chrono::steady_clock::time_point deadline) const {
  return wait_until([stream] { return cudaStreamQuery(stream); }, deadline);
}

void CudaDevice::wait_event(cudaEvent_t event) const {
  wait_until([event] { return cudaEventQuery(event); }, std::chrono::steady_clock::time_point::max());
}

bool CudaDevice::group_aborted() const { return group_aborted_ && group_aborted_->load(std::memory_order_acquire); }

void CudaDevice::throw_if_aborted() const {
  if (group_aborted()) throw Aborted(name() + ": its communicator group was aborted");
}

}  // namespace mnist_mt::cuda
