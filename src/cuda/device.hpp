#pragma once
// A GPU as the trainer sees it (include/mnist_mt/device.hpp): a compute stream, a comm
// stream (highest priority, so allreduce kernels are scheduled ahead of backward work)
// and a copy stream for input uploads, ordered one against another by events only.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mnist_mt/device.hpp"
#include "owners.hpp"

namespace mnist_mt::cuda {

class CudaDevice final : public Device {
 public:
  // Makes `id` current on the calling thread and creates the streams there.
  explicit CudaDevice(int id);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  void activate() override;
  void comm_wait_compute() override;
  void compute_wait_comm() override;
  void synchronize() override;
  void wait_compute() override;
  std::string name() const override { return "cuda:" + std::to_string(id_); }
  TimeMark mark(Lane lane) override;
  std::optional<double> mark_time(const TimeMark& mark) override;
  std::optional<double> elapsed(const TimeMark& from, const TimeMark& to) override;
  // Events and collective operations (device_ops.cpp): the local group's.
  std::unique_ptr<DeviceEvent> make_event() override;
  void record(Lane lane, DeviceEvent& event) override;
  void wait_for(Lane lane, const DeviceEvent& event) override;
  void reduce(Lane lane, std::span<const float* const> in, std::span<float* const> out, std::size_t count,
              ReduceOp op, std::size_t divisor) override;
  void copy(Lane lane, float* to, const float* from, std::size_t count) override;

  // CUDA graphs: the compute stream captures (thread-local mode, as NCCL asks of a
  // thread per GPU), and the streams that wait for it join the capture.
  bool can_record() const override { return record_allowed_; }
  void begin_record() override;
  std::unique_ptr<RecordedStep> end_record(std::string& why) override;
  // Throws Aborted, launching nothing, once the group is aborted: a recorded step may
  // hold collectives of its (aborted) communicators.
  std::size_t replay(RecordedStep& step, std::span<TimeMark> marks) override;
  // Main thread, by the communicators made for the device: whether its steps may be
  // recorded (on with BackendOptions::cuda_graphs, off for ranks that share a GPU, whose
  // collectives meet on the host at every call, which a replay would not repeat).
  void allow_record(bool allowed) { record_allowed_ = allowed; }
  bool recording() const { return recording_; }
  // Records `event` on `stream`; while recording, as a node of the graph (an external
  // event record), so that each replay records it.
  void record_event(cudaEvent_t event, cudaStream_t stream) const;

  int id() const { return id_; }
  cudaStream_t compute() const { return compute_.get(); }
  cudaStream_t comm() const { return comm_.get(); }
  cudaStream_t copy() const { return copy_.get(); }
  cudaStream_t stream(Lane lane) const { return lane == Lane::kCompute ? compute() : comm(); }

  // Main thread, by the communicator group made for this device: its abort flag, which
  // the device reports from then on, and a check that throws when the group has failed
  // (NCCL's asynchronous errors), which every wait for a stream polls.
  void join_group(std::shared_ptr<const std::atomic<bool>> aborted, std::function<void()> check_group) {
    group_aborted_ = std::move(aborted);
    check_group_ = std::move(check_group);
  }
  // Throws Aborted once the device's communicator group has been aborted.
  void throw_if_aborted() const;
  // Blocks until `stream` (one of this device's) is idle. Polls rather than blocks in
  // cudaStreamSynchronize, so that a collective that can never finish (a peer failed, or
  // NCCL reported an error) ends the wait with an error instead of holding it forever.
  // Once the group is aborted the wait goes on until the stream has really drained (the
  // aborted collectives return), for kDrainAfterAbort at most, then throws Aborted: no
  // buffer is freed under work still running.
  void wait_stream(cudaStream_t stream) const;
  // As wait_stream(), but false once `deadline` has passed with the stream still busy
  // (and the group neither aborted nor failed).
  bool wait_stream_until(cudaStream_t stream, std::chrono::steady_clock::time_point deadline) const;
  // As wait_stream(), until the device has passed `event`.
  void wait_event(cudaEvent_t event) const;
  // How long a wait that saw the abort lets the device's work drain before giving up on it.
  static constexpr std::chrono::seconds kDrainAfterAbort{10};
  // Any thread: true once a wait gave up on work that outlived an abort by kDrainAfterAbort
  // (reported once on stderr). That work may still use any buffer: from then on no device
  // or pinned memory is freed (keep_memory_from_now, owners.hpp).
  bool wedged() const { return wedged_.load(std::memory_order_acquire); }

 private:
  int id_;
  StreamOwner compute_;
  StreamOwner comm_;
  StreamOwner copy_;
  EventOwner compute_mark_;
  EventOwner comm_mark_;
  // Device::mark(): a ring of timing events, and the origin they are measured from, with
  // the host clock's reading when the device passed it.
  std::vector<EventOwner> marks_;
  std::uint64_t marks_taken_ = 0;
  EventOwner origin_;
  double origin_seconds_ = 0;
  bool record_allowed_ = false;
  bool recording_ = false;
  std::vector<cudaEvent_t> recorded_marks_;  // the events mark() recorded into, while recording
  std::vector<Lane> recorded_lanes_;
  std::shared_ptr<const std::atomic<bool>> group_aborted_;  // none until a group is made
  std::function<void()> check_group_;
  mutable std::atomic<bool> wedged_{false};

  bool group_aborted() const;
  // Polls `query` (cudaStreamQuery, cudaEventQuery) until it says done (true), or until
  // `deadline` (false); see wait_stream() for an abort.
  template <class Query>
  bool wait_until(Query&& query, std::chrono::steady_clock::time_point deadline) const;
};

// Between two polls of a wait: spins for the first (most waits are tens of microseconds
// long), then sleeps briefly.
void pause_between_polls(int polls);

}  // namespace mnist_mt::cuda
