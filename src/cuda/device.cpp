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
      comm_mark_(make_event()) {}

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

void CudaDevice::wait_stream(cudaStream_t stream) const {
  // Spins for the first tens of microseconds (a step's waits are mostly that short),
  // then sleeps between polls.
  using namespace std::chrono_literals;
  for (int polls = 0;; ++polls) {
    const cudaError_t state = cudaStreamQuery(stream);
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

void CudaDevice::throw_if_aborted() const {
  if (group_aborted_ && group_aborted_->load(std::memory_order_acquire))
    throw Aborted(name() + ": its communicator group was aborted");
}

}  // namespace mnist_mt::cuda
