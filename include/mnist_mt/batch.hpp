#pragma once
// One rank's batch of one step, as the loader hands it to a replica: uint8 images (the
// device normalises them), labels, and where each sample is in its split.
#include <cstdint>
#include <span>
#include <vector>

namespace mnist_mt {

// A split's samples as a replica may keep them (Replica::hold_data): uint8 images,
// kImageBytes a sample, and a label each.
struct Samples {
  std::span<const std::uint8_t> images;
  std::span<const std::uint8_t> labels;
};

struct Batch {
  std::uint32_t epoch = 0;
  std::uint32_t step = 0;
  std::uint32_t size = 0;               // samples in this batch (<= capacity)
  std::vector<std::uint8_t> images;     // capacity * kImageBytes; the first size*kImageBytes are valid
  std::vector<std::uint8_t> labels;     // capacity
  std::vector<std::uint32_t> indices;   // capacity; global sample indices into the split
  // The images of the split `indices` index (Samples::images.data(), as the loader sets
  // it): a replica holding that split gathers the batch from its own copy. Null: the
  // images come from elsewhere.
  const std::uint8_t* split_images = nullptr;
};

}  // namespace mnist_mt
