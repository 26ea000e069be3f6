#pragma once
// Batches to the device: the host copies a batch (and its epoch) into one of two pinned slots, the copy
// stream uploads it, and the compute stream waits for the upload by an event. With two
// slots the upload of the next batch overlaps the compute still reading the last one. A
// batch of a split held on the device (hold()) uploads its sample indices and epoch
// alone, and its images and labels are gathered there.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "device.hpp"
#include "device_data.hpp"
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
  // `hold_data`: hold() keeps what it is given (BackendOptions::device_data).
  InputStage(CudaDevice& device, std::uint32_t max_batch, bool hold_data = false);
  ~InputStage();
  InputStage(const InputStage&) = delete;
  InputStage& operator=(const InputStage&) = delete;

  // Copies `batch` into the next slot and enqueues its upload; work enqueued on the
  // compute stream from now on sees it. The batch may be reused once this returns.
  DeviceBatch upload(const Batch& batch);
  // upload() of sample indices, and of `epoch` where given (images and labels null): for
  // rows whose images arrive by a collective, or are gathered from a held split.
  DeviceBatch upload_indices(std::span<const std::uint32_t> indices, const std::uint32_t* epoch = nullptr);
  // Keeps `splits` in device memory (hold_split) where the stage was made to, in place of
  // those it held. They outlive their use here.
  void hold(std::span<const Samples> splits);
  // The batch's rows normalised into x[size][kImageBytes], on the compute stream: from
  // the device's copy of its split when held (Batch::split_images) and the indices are in
  // it, else from its images, uploaded. The returned batch's images are null in the first
  // case; its labels are on the device in either.
  DeviceBatch load(const Batch& batch, float* x, float mean, float std);
  // A rank's epoch of training samples of a held split (Replica::plan_epoch), copied to
  // the device with the epoch and a step counter: load() of the batch that is next among
  // them then copies nothing, and gather_planned() enqueues its gather; true. A plan that
  // does not fit (a split not held, rows over the maximum, indices past the split, none)
  // is none: false. A batch of the plan's split and epoch out of its order throws.
  bool plan(const std::uint8_t* split_images, std::uint32_t epoch, std::span<const std::uint32_t> samples,
            std::uint32_t rows);
  // After load() of a planned batch, on the compute stream (inside a recorded step, so
  // that each replay takes the next step's rows): the rows into x as load() writes them,
  // from the device's step counter, which it advances. Once per load() when enqueued as
  // it runs; while recording, again if the recording is dropped and the step enqueued
  // (StepGraphs). Otherwise nothing.
  void gather_planned(float* x, float mean, float std);
  // The compute stream's work enqueued so far is the last to read the current slot: the
  // upload that next overwrites it waits for that work. Nothing for a planned batch.
  void release();
  // The slot the last upload filled (0 or 1), or kPlannedSlot for a planned batch.
  static constexpr int kPlannedSlot = 2;
  int slot() const { return planned_ ? kPlannedSlot : static_cast<int>(current_); }

 private:
  std::uint8_t* next_slot();
  const std::uint8_t* send(std::size_t from, std::size_t bytes);

  struct Slot {
    PinnedBuffer<std::uint8_t> host;
    DeviceBuffer<std::uint8_t> device;
    EventOwner uploaded;  // on the copy stream: the upload from `host` is done
    EventOwner consumed;  // on the compute stream: the last read of `device` is done
  };

  const HeldSplit* held_for(const Batch& batch) const;
  bool is_planned_next(const Batch& batch) const;

  // The device's plan and its buffers, made by hold() for the largest split held (no
  // allocation once collectives run), so that the pointers a recorded step holds stay;
  // steps == 0: nothing planned.
  struct Plan {
    const std::uint8_t* host_images = nullptr;  // the split's, as batches name it
    const HeldSplit* split = nullptr;           // held in held_
    std::uint32_t epoch = 0, rows = 0, steps = 0;
    std::uint32_t next = 0;                  // the step the next planned load() takes
    PinnedBuffer<std::uint32_t> host;        // as uploaded: header, then the samples
    DeviceBuffer<std::uint32_t> device;
    EventOwner uploaded;                     // on the compute stream: `host` may be rewritten
    DeviceBuffer<std::uint32_t> samples;     // max_batch: the step's, written by the gather
    DeviceBuffer<std::uint8_t> labels;       // max_batch
  };

  CudaDevice& device_;
  std::uint32_t max_batch_;
  struct Held {
    const std::uint8_t* host_images;  // Samples::images.data(): what batches of it name
    std::shared_ptr<const HeldSplit> split;
  };
  bool hold_data_;
  std::vector<Held> held_;
  std::array<Slot, 2> slots_;
  std::size_t current_ = 1;
  Plan plan_;
  bool planned_ = false;  // the last load() was of the plan
  bool pending_ = false;  // and gather_planned() has not enqueued its gather yet
};

}  // namespace mnist_mt::cuda
