#include "input.hpp"

#include <cstring>
#include <string>

#include "errors.hpp"
#include "kernels.hpp"
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

InputStage::InputStage(CudaDevice& device, std::uint32_t max_batch, bool hold_data)
    : device_(device), max_batch_(max_batch), hold_data_(hold_data) {
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

void InputStage::hold(std::span<const Samples> splits) {
  held_.clear();
  if (!hold_data_) return;
  for (const Samples& split : splits) {
    if (auto on_device = hold_split(device_, split)) held_.push_back({split.images.data(), std::move(on_device)});
  }
}

const HeldSplit* InputStage::held_for(const Batch& batch) const {
  if (batch.split_images == nullptr || batch.indices.size() < batch.size) return nullptr;
  for (const Held& h : held_) {
    if (h.host_images != batch.split_images) continue;
    for (std::uint32_t i = 0; i < batch.size; ++i)
      if (batch.indices[i] >= h.split->size()) return nullptr;  // not this split's: the images travel instead
    return h.split.get();
  }
  return nullptr;
}

DeviceBatch InputStage::load(const Batch& batch, float* x, float mean, float std) {
  const HeldSplit* held = held_for(batch);
  if (held == nullptr) {
    const DeviceBatch b = upload(batch);
    normalize_images(b.images, x, std::size_t{b.size} * kImageBytes, mean, std, device_.compute());
    return b;
  }
  const std::uint32_t n = batch.size;
  if (n == 0 || n > max_batch_ || batch.indices.size() < n)
    throw RuntimeFailure(device_.name() + ": batch of " + std::to_string(n) + " samples for a replica of at most " +
                         std::to_string(max_batch_) + ", or its indices are short");
  const Layout at = layout(n);
  std::uint8_t* host = next_slot();
  std::memcpy(host + at.indices, batch.indices.data(), std::size_t{n} * sizeof(std::uint32_t));
  std::memcpy(host + at.epoch, &batch.epoch, sizeof batch.epoch);
  std::uint8_t* dev = send(at.indices, at.bytes - at.indices);
  const auto* samples = reinterpret_cast<const std::uint32_t*>(dev + at.indices);
  gather_images(held->images(), held->labels(), samples, n, x, dev + at.labels, mean, std, device_.compute());
  return {n, nullptr, dev + at.labels, samples, reinterpret_cast<const std::uint32_t*>(dev + at.epoch)};
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
std::uint8_t* InputStage::send(std::size_t from, std::size_t bytes) {
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
