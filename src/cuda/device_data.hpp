#pragma once
// A data set's split kept in one GPU's memory as uint8 images and labels (47 MB for
// MNIST's training split), once per GPU: ranks that share a GPU share it. A batch of a
// held split then crosses PCIe as its sample indices alone, and its rows are gathered on
// the device (gather_images). docs/architecture.md, decision 17.
#include <cstdint>
#include <memory>

#include "device.hpp"
#include "mnist_mt/batch.hpp"
#include "owners.hpp"

namespace mnist_mt::cuda {

class HeldSplit {
 public:
  HeldSplit(CudaDevice& device, Samples split);
  HeldSplit(const HeldSplit&) = delete;
  HeldSplit& operator=(const HeldSplit&) = delete;

  const std::uint8_t* images() const { return images_.data(); }
  const std::uint8_t* labels() const { return labels_.data(); }
  std::uint32_t size() const { return size_; }

 private:
  DeviceBuffer<std::uint8_t> images_;
  DeviceBuffer<std::uint8_t> labels_;
  std::uint32_t size_;
};

// `split` held on `device`'s GPU: uploaded by the first caller for that GPU and content
// (a 64-bit hash of its size, labels and images), shared with later callers while any of them
// keeps it. Null, after a one-line warning on standard error, when the GPU has not the
// memory: batches of that split are then copied from the host as before. On the thread
// that drives `device`, after activate(); thread-safe.
std::shared_ptr<const HeldSplit> hold_split(CudaDevice& device, Samples split);

}  // namespace mnist_mt::cuda
