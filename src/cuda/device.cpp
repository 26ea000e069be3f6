#include "device.hpp"

#include <chrono>
#include <exception>
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
      compute_mark_(make_event()),
      comm_mark_(make_event()),
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
  CUDA_CHECK(cudaEventRecord(marks_[m.id % kMarks].get(), lane == Lane::kCompute ? compute_.get() : comm_.get()));
  return m;
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
void CudaDevice::wait_until(Query&& query) const {
  // Spins for the first tens of microseconds (a step's waits are mostly that short),
  // then sleeps between polls.
  using namespace std::chrono_literals;
  for (int polls = 0;; ++polls) {
    const cudaError_t state = query();
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) CUDA_CHECK(state);
    throw_if_aborted();
    if (check_group_) check_group_();
    if (polls < 100) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(50us);
    }
  }
}

void CudaDevice::wait_stream(cudaStream_t stream) const {
  wait_until([stream] { return cudaStreamQuery(stream); });
}

void CudaDevice::wait_event(cudaEvent_t event) const {
  wait_until([event] { return cudaEventQuery(event); });
}

void CudaDevice::throw_if_aborted() const {
  if (group_aborted_ && group_aborted_->load(std::memory_order_acquire))
    throw Aborted(name() + ": its communicator group was aborted");
}

}  // namespace mnist_mt::cuda
