#include "input.hpp"

#include <cstring>
#include <string>

#include "errors.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cuda {
namespace {

// A batch of n samples packed as [images | labels | pad | indices | epoch], so one copy
// moves it.
struct Layout {
  std::size_t labels, indices, epoch, bytes;
};

Layout layout(std::uint32_t n) {
  const std::size_t labels = std::size_t{n} * kImageBytes;
  const std::size_t indices = (labels + n + 15) / 16 * 16;
  const std::size_t epoch = indices + std::size_t{n} * sizeof(std::uint32_t);
  return {labels, indices, epoch, epoch + sizeof(std::uint32_t)};
}

}  // namespace

InputStage::InputStage(CudaDevice& device, std::uint32_t max_batch) : device_(device), max_batch_(max_batch) {
  const std::size_t bytes = layout(max_batch).bytes;
  for (Slot& s : slots_) {
    s.host = PinnedBuffer<std::uint8_t>(bytes);
    s.device = DeviceBuffer<std::uint8_t>(bytes);
    s.uploaded = make_event();
    s.consumed = make_event();
  }
}

InputStage::~InputStage() {
  // The pinned slots may still be the source of an upload in flight.
  for (Slot& s : slots_) cudaEventSynchronize(s.uploaded.get());
}

DeviceBatch InputStage::upload(const Batch& batch) {
  const std::uint32_t n = batch.size;
  if (n == 0 || n > max_batch_ || batch.images.size() < std::size_t{n} * kImageBytes || batch.labels.size() < n ||
      batch.indices.size() < n)
    throw RuntimeFailure(device_.name() + ": batch of " + std::to_string(n) + " samples for a replica of at most " +
                         std::to_string(max_batch_) + ", or its buffers are short");
  const Layout at = layout(n);
  std::uint8_t* host = next_slot();
  std::memcpy(host, batch.images.data(), std::size_t{n} * kImageBytes);
  std::memcpy(host + at.labels, batch.labels.data(), n);
  std::memcpy(host + at.indices, batch.indices.data(), std::size_t{n} * sizeof(std::uint32_t));
  std::memcpy(host + at.epoch, &batch.epoch, sizeof batch.epoch);
  const std::uint8_t* dev = send(0, at.bytes);
  return {n, dev, dev + at.labels, reinterpret_cast<const std::uint32_t*>(dev + at.indices),
          reinterpret_cast<const std::uint32_t*>(dev + at.epoch)};
}

DeviceBatch InputStage::upload_indices(std::span<const std::uint32_t> indices) {
  const std::size_t n = indices.size();
  if (n == 0 || n > max_batch_)
    throw RuntimeFailure(device_.name() + ": sample indices of " + std::to_string(n) +
                         " rows for a replica of at most " + std::to_string(max_batch_));
  const Layout at = layout(static_cast<std::uint32_t>(n));
  std::uint8_t* host = next_slot();
  std::memcpy(host + at.indices, indices.data(), n * sizeof(std::uint32_t));
  const std::uint8_t* dev = send(at.indices, n * sizeof(std::uint32_t));
  return {static_cast<std::uint32_t>(n), nullptr, nullptr, reinterpret_cast<const std::uint32_t*>(dev + at.indices),
          nullptr};
}

// The host may overwrite the pinned slot once its previous upload is done: normally
// long ago, since two batches were enqueued after it.
std::uint8_t* InputStage::next_slot() {
  current_ ^= 1;
  Slot& s = slots_[current_];
  CUDA_CHECK(cudaEventSynchronize(s.uploaded.get()));
  return s.host.data();
}

// Uploads bytes [from, from + bytes) of the current slot once the compute stream has
// finished reading it; compute work enqueued from now on sees them. Returns the slot's
// device memory.
const std::uint8_t* InputStage::send(std::size_t from, std::size_t bytes) {
  Slot& s = slots_[current_];
  CUDA_CHECK(cudaStreamWaitEvent(device_.copy(), s.consumed.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(s.device.data() + from, s.host.data() + from, bytes, cudaMemcpyHostToDevice,
                             device_.copy()));
  CUDA_CHECK(cudaEventRecord(s.uploaded.get(), device_.copy()));
  CUDA_CHECK(cudaStreamWaitEvent(device_.compute(), s.uploaded.get(), 0));
  return s.device.data();
}

// Recorded into a step's graph as well: each replay releases the slot it read.
void InputStage::release() { device_.record_event(slots_[current_].consumed.get(), device_.compute()); }

}  // namespace mnist_mt::cuda
