#include "buckets.hpp"

#include <algorithm>

#include "mnist_mt/model.hpp"

namespace mnist_mt {

std::vector<Bucket> make_buckets(double bucket_mb, int left_out) {
  constexpr double kMiB = 1024.0 * 1024.0;
  double cap = std::min(1.0, bucket_mb) * kMiB;
  std::vector<Bucket> buckets;
  bool open = false;
  for (int layer = kLayers - 1; layer >= 0; --layer) {
    const Range range = layer_range(layer);
    if (layer == left_out) {  // closes the open bucket, as filling it would
      if (open) cap = bucket_mb * kMiB;
      open = false;
      continue;
    }
    if (!open) buckets.push_back({range.offset, 0, layer});
    Bucket& b = buckets.back();
    b.offset = range.offset;  // layers are contiguous, so the bucket grows downwards
    b.count += range.count;
    b.ready_layer = layer;
    open = static_cast<double>(b.count * sizeof(float)) < cap;
    if (!open) cap = bucket_mb * kMiB;
  }
  return buckets;
}

}  // namespace mnist_mt
