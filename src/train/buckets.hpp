#pragma once
// Gradient buckets (docs/architecture.md decision 7): contiguous ranges of the flat gradient
// buffer, filled in reverse layer order, each allreduced as soon as its last layer's
// gradients are written.
#include <cstddef>
#include <vector>

namespace mnist_mt {

struct Bucket {
  std::size_t offset;  // floats into the flat gradient buffer
  std::size_t count;
  int ready_layer;  // the bucket is complete once backward has written this layer
};

// PyTorch's assignment: layers from fc2 down to conv1 join the open bucket until it
// holds at least its cap; the first cap is min(1 MiB, bucket_mb), the others bucket_mb.
// A layer `left_out` (fc1 when its factors are exchanged) joins none, and closes the
// bucket before it.
std::vector<Bucket> make_buckets(double bucket_mb, int left_out = -1);

}  // namespace mnist_mt
