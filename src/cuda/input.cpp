#include "input.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <iostream>
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
  // The pinned slots and the plan's may still be the source of an upload in flight.
  for (Slot& s : slots_) cudaEventSynchronize(s.uploaded.get());
  if (plan_.uploaded.get() != nullptr) cudaEventSynchronize(plan_.uploaded.get());
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

DeviceBatch InputStage::upload_indices(std::span<const std::uint32_t> indices, const std::uint32_t* epoch) {
  planned_ = pending_ = false;
  const std::size_t n = indices.size();
  if (n == 0 || n > max_batch_)
    throw RuntimeFailure(device_.name() + ": sample indices of " + std::to_string(n) +
                         " rows for a replica of at most " + std::to_string(max_batch_));
  const Layout at = layout(static_cast<std::uint32_t>(n));
  std::uint8_t* host = next_slot();
  std::memcpy(host + at.indices, indices.data(), n * sizeof(std::uint32_t));
  if (epoch != nullptr) std::memcpy(host + at.epoch, epoch, sizeof *epoch);  // right after the indices
  const std::uint8_t* dev = send(at.indices, (epoch != nullptr ? at.bytes : at.epoch) - at.indices);
  return {static_cast<std::uint32_t>(n), nullptr, nullptr, reinterpret_cast<const std::uint32_t*>(dev + at.indices),
          epoch != nullptr ? reinterpret_cast<const std::uint32_t*>(dev + at.epoch) : nullptr};
}

void InputStage::hold(std::span<const Samples> splits) {
  device_.activate();
  plan_.steps = 0;
  plan_.split = nullptr;
  planned_ = pending_ = false;
  held_.clear();
  if (!hold_data_) return;
  std::uint32_t largest = 0;
  for (const Samples& split : splits) {
    if (auto on_device = hold_split(device_, split)) {
      largest = std::max(largest, on_device->size());
      held_.push_back({split.images.data(), std::move(on_device)});
    }
  }
  if (largest == 0 || plan_.device.size() >= kPlanHeader + largest) return;
  try {
    plan_.host = PinnedBuffer<std::uint32_t>(kPlanHeader + largest);
    plan_.device = DeviceBuffer<std::uint32_t>(kPlanHeader + largest);
    plan_.uploaded = make_event();
    plan_.samples = DeviceBuffer<std::uint32_t>(max_batch_);
    plan_.labels = DeviceBuffer<std::uint8_t>(max_batch_);
  } catch (const std::exception& e) {  // no plan then: the batches are gathered by their indices
    (void)cudaGetLastError();
    plan_.device = {};
    std::cerr << "mnist_mt: warning: " << device_.name() << ": no room to plan epochs on the device (" << e.what()
              << ")\n";
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

bool InputStage::plan(const std::uint8_t* split_images, std::uint32_t epoch, std::span<const std::uint32_t> samples,
                      std::uint32_t rows) {
  device_.activate();
  plan_.steps = 0;
  planned_ = pending_ = false;
  const auto held =
      std::find_if(held_.begin(), held_.end(), [&](const Held& h) { return h.host_images == split_images; });
  if (held == held_.end() || rows == 0 || rows > max_batch_ || samples.empty() || samples.size() % rows != 0)
    return false;
  const HeldSplit& split = *held->split;
  if (std::any_of(samples.begin(), samples.end(), [&](std::uint32_t s) { return s >= split.size(); })) return false;
  const std::size_t words = kPlanHeader + samples.size();
  if (words > plan_.device.size()) return false;
  CUDA_CHECK(cudaEventSynchronize(plan_.uploaded.get()));  // the last plan's upload has read `host`
  plan_.host.data()[kPlanEpoch] = epoch;
  plan_.host.data()[kPlanStep] = 0;
  std::copy(samples.begin(), samples.end(), plan_.host.data() + kPlanHeader);
  // On the compute stream: after every step that read the last plan.
  CUDA_CHECK(cudaMemcpyAsync(plan_.device.data(), plan_.host.data(), words * sizeof(std::uint32_t),
                             cudaMemcpyHostToDevice, device_.compute()));
  CUDA_CHECK(cudaEventRecord(plan_.uploaded.get(), device_.compute()));
  plan_.host_images = split_images;
  plan_.split = &split;
  plan_.epoch = epoch;
  plan_.rows = rows;
  plan_.steps = static_cast<std::uint32_t>(samples.size() / rows);
  plan_.next = 0;
  return true;
}

bool InputStage::is_planned_next(const Batch& batch) const {
  if (plan_.next >= plan_.steps || batch.size != plan_.rows || batch.indices.size() < batch.size) return false;
  const std::uint32_t* want = plan_.host.data() + kPlanHeader + std::size_t{plan_.next} * plan_.rows;
  return std::equal(batch.indices.begin(), batch.indices.begin() + batch.size, want);
}

void InputStage::gather_planned(float* x, float mean, float std) {
  if (!pending_) return;
  // A recording runs nothing: if it is dropped, the step is enqueued again, gather and all.
  if (!device_.recording()) pending_ = false;
  cuda::gather_planned(plan_.device.data(), plan_.rows, plan_.split->images(), plan_.split->labels(), x,
                       plan_.samples.data(), plan_.labels.data(), mean, std, device_.compute());
}

DeviceBatch InputStage::load(const Batch& batch, float* x, float mean, float std) {
  planned_ = pending_ = false;
  if (plan_.steps != 0 && batch.split_images == plan_.host_images && batch.epoch == plan_.epoch) {
    if (!is_planned_next(batch)) {
      plan_.steps = 0;  // out of step with the device's counter
      throw RuntimeFailure(device_.name() + ": a batch of epoch " + std::to_string(batch.epoch) + " (step " +
                           std::to_string(batch.step) + ") is not step " + std::to_string(plan_.next) +
                           " of the epoch's plan");
    }
    ++plan_.next;
    planned_ = pending_ = true;
    return {plan_.rows, nullptr, plan_.labels.data(), plan_.samples.data(), plan_.device.data() + kPlanEpoch};
  }
  const HeldSplit* held = held_for(batch);
  if (held == nullptr) {
    const DeviceBatch b = upload(batch);
    normalize_images(b.images, x, std::size_t{b.size} * kImageBytes, mean, std, device_.compute());
    return b;
  }
  // held_for() saw indices for every row.
  DeviceBatch b = upload_indices(std::span(batch.indices).first(batch.size), &batch.epoch);
  std::uint8_t* labels = slots_[current_].device.data() + layout(b.size).labels;  // the slot's, gathered into
  gather_images(held->images(), held->labels(), b.indices, b.size, x, labels, mean, std, device_.compute());
  b.labels = labels;
  return b;
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
void InputStage::release() {
  if (!planned_) device_.record_event(slots_[current_].consumed.get(), device_.compute());
}

}  // namespace mnist_mt::cuda
