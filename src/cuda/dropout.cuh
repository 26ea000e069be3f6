#pragma once
// Dropout of one element, shared by the kernels that fuse it.
#include "kernels.hpp"

namespace mnist_mt::cuda {

__device__ __forceinline__ float apply_dropout(float v, const DropoutArgs& d, std::size_t row,
                                               std::uint32_t element) {
  if (d.p <= 0.0f) return v;
  return dropout_keep(d.seed, d.epoch, d.samples[row], d.stream, element, d.p) ? v * d.scale : 0.0f;
}

}  // namespace mnist_mt::cuda
