// CudaDevice's events and collective operations: what the local group
// (mnist_mt/local_group.hpp) enqueues for ranks that share a GPU.
#include <string>
#include <type_traits>

#include "device.hpp"
#include "errors.hpp"
#include "kernels.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cuda {
namespace {

struct CudaEvent final : DeviceEvent {
  explicit CudaEvent(int device) : device(device) {}
  EventOwner event = make_event();
  int device;
  bool recorded = false;
};

// CudaEvent& or const CudaEvent&, as `event` is.
template <typename Event>
auto& cuda_event(Event& event) {
  auto* e = dynamic_cast<std::conditional_t<std::is_const_v<Event>, const CudaEvent, CudaEvent>*>(&event);
  if (e == nullptr) throw RuntimeFailure("an event of another kind of device given to a CUDA device");
  return *e;
}

}  // namespace

std::unique_ptr<DeviceEvent> CudaDevice::make_event() {
  activate();
  return std::make_unique<CudaEvent>(id_);
}

void CudaDevice::record(Lane lane, DeviceEvent& event) {
  CudaEvent& e = cuda_event(event);
  if (recording_) throw RuntimeFailure(name() + ": a collective event inside a recorded step");
  CUDA_CHECK(cudaEventRecord(e.event.get(), stream(lane)));
  e.recorded = true;
}

void CudaDevice::wait_for(Lane lane, const DeviceEvent& event) {
  const CudaEvent& e = cuda_event(event);
  if (!e.recorded) throw RuntimeFailure(name() + ": a wait for an event never recorded");
  CUDA_CHECK(cudaStreamWaitEvent(stream(lane), e.event.get(), 0));
}

void CudaDevice::reduce(Lane lane, std::span<const float* const> in, std::span<float* const> out, std::size_t count,
                        ReduceOp op, std::size_t divisor) {
  if (in.empty() || in.size() > kReduceBuffers || out.size() > kReduceBuffers)
    throw RuntimeFailure(name() + ": a reduction of " + std::to_string(in.size()) + " buffers into " +
                         std::to_string(out.size()) + " (at most " + std::to_string(kReduceBuffers) +
                         " each: ranks and shards that share a GPU)");
  reduce_in_order(in.data(), in.size(), out.data(), out.size(), count, op == ReduceOp::kAverage, divisor,
                  stream(lane));
}

void CudaDevice::copy(Lane lane, float* to, const float* from, std::size_t count) {
  if (count == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(to, from, count * sizeof(float), cudaMemcpyDeviceToDevice, stream(lane)));
}

}  // namespace mnist_mt::cuda
