#pragma once
// Batches to the device: the host copies a batch (and its epoch) into one of two pinned slots, the copy
// stream uploads it, and the compute stream waits for the upload by an event. With two
// slots the upload of the next batch overlaps the compute still reading the last one.
#include <array>
#include <cstdint>
#include <span>

#include "device.hpp"
#include "mnist_mt/batch.hpp"

namespace mnist_mt::cuda {

struct DeviceBatch {
  std::uint32_t size = 0;
  const std::uint8_t* images = nullptr;    // size * kImageBytes
  const std::uint8_t* labels = nullptr;    // size
  const std::uint32_t* indices = nullptr;  // size
  const std::uint32_t* epoch = nullptr;    // the batch's epoch (Batch::epoch); null for indices alone
};

class InputStage {
 public:
  InputStage(CudaDevice& device, std::uint32_t max_batch);
  ~InputStage();
  InputStage(const InputStage&) = delete;
  InputStage& operator=(const InputStage&) = delete;

  // Copies `batch` into the next slot and enqueues its upload; work enqueued on the
  // compute stream from now on sees it. The batch may be reused once this returns.
  DeviceBatch upload(const Batch& batch);
  // upload() of sample indices alone (images and labels null), for rows whose images
  // arrive by a collective.
  DeviceBatch upload_indices(std::span<const std::uint32_t> indices);
  // The compute stream's work enqueued so far is the last to read the current slot: the
  // upload that next overwrites it waits for that work.
  void release();
  // The slot the last upload filled (0 or 1).
  int slot() const { return static_cast<int>(current_); }

 private:
  std::uint8_t* next_slot();
  const std::uint8_t* send(std::size_t from, std::size_t bytes);

  struct Slot {
    PinnedBuffer<std::uint8_t> host;
    DeviceBuffer<std::uint8_t> device;
    EventOwner uploaded;  // on the copy stream: the upload from `host` is done
    EventOwner consumed;  // on the compute stream: the last read of `device` is done
  };

  CudaDevice& device_;
  std::uint32_t max_batch_;
  std::array<Slot, 2> slots_;
  std::size_t current_ = 1;
};

}  // namespace mnist_mt::cuda
