#pragma once
// conv2's ReLU fused with the 2x2 max pooling that follows it, forward and backward, on
// the nChw{B}c layout (isa.hpp: channel_block). The pooled map is written, and its
// gradient read, in PyTorch's flatten order (batch x 64 x 12 x 12) that fc1 uses, so no
// reorder runs between the pooling and fc1.
#include <cstdint>

#include "isa.hpp"

namespace mnist_mt::cpu {

// Where the gradient of a pooled value goes: 0..3 is the window's first maximum in
// row-major order (or its last NaN, as PyTorch's); kPoolNoGradient when that maximum is
// not > 0 (the ReLU cut it, or it is NaN).
inline constexpr std::uint8_t kPoolNoGradient = 4;

struct PoolKernels {
  // out = max(0, max of each 2x2 window of in): in is conv2's output before its ReLU,
  // batch x 64/B x 24 x 24 x B; out batch x 64 x 12 x 12; argmax batch x 64/B x 12 x 12 x B.
  void (*forward)(const float* in, std::uint32_t batch, float* out, std::uint8_t* argmax);
  // d_in, the gradient of conv2's output before its ReLU (every element written), from
  // d_out, the gradient of out (flatten order): d_out at each window's argmax, else 0.
  void (*backward)(const float* d_out, const std::uint8_t* argmax, std::uint32_t batch, float* d_in);
};

PoolKernels pool_kernels(Isa isa);

}  // namespace mnist_mt::cpu
