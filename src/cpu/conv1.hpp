#pragma once
// conv1 (1 -> 32 channels, 3x3, stride 1) on the CPU: one input channel makes it nine
// multiply-adds per output, which oneDNN handles poorly (its backward-weights pass is a
// reference loop on AVX2). Direct loops vectorised across a block of B output channels,
// writing and reading the nChw{B}c layout conv2 uses (isa.hpp: channel_block).
#include <cstdint>

#include "isa.hpp"

namespace mnist_mt::cpu {

struct Conv1Kernels {
  // out = ReLU(conv1(x) + b): x is batch x 28 x 28, w the state dict's 32x1x3x3, out
  // batch x 32/B x 26 x 26 x B.
  void (*forward)(const float* x, const float* w, const float* b, std::uint32_t batch, float* out);
  // The weight and bias gradients (state-dict layouts) from d_out, the gradient of the
  // ReLU's output, with the ReLU's backward applied: it passes where out > 0.
  void (*backward_weights)(const float* x, const float* out, const float* d_out, std::uint32_t batch, float* dw,
                           float* db);
};

Conv1Kernels conv1_kernels(Isa isa);

}  // namespace mnist_mt::cpu
