#pragma once
// One rank's batch of one step, as the loader hands it to a replica: uint8 images (the
// device normalises them), labels, and where each sample is in its split.
#include <cstdint>
#include <vector>

namespace mnist_mt {

struct Batch {
  std::uint32_t epoch = 0;
  std::uint32_t step = 0;
  std::uint32_t size = 0;               // samples in this batch (<= capacity)
  std::vector<std::uint8_t> images;     // capacity * kImageBytes; the first size*kImageBytes are valid
  std::vector<std::uint8_t> labels;     // capacity
  std::vector<std::uint32_t> indices;   // capacity; global sample indices into the split
};

}  // namespace mnist_mt
