#pragma once
// The transforms of conv2 (32 -> 64 channels, 3x3, on 26x26) by Winograd F(4x4, 3x3):
// 6x6 input tiles at stride 4 cover the 26x26 map exactly and give the 24x24 output as
// 6x6 tiles of 4x4, with 36 element-wise products per channel pair instead of 144
// multiply-adds (Lavin & Gray's B, G and A). The channel sums between the transforms are
// batched matrix products (conv2_backward.hpp). Position xi = 6*row + column of a 6x6 tile; tile
// t = 36*image + 6*tile_row + tile_column. Activations are nChw{B}c (isa.hpp).
#include <cstdint>

#include "isa.hpp"

namespace mnist_mt::cpu {

inline constexpr std::size_t kWinoPositions = 36, kWinoTiles = 36;  // per 6x6 tile; tiles per image

// Floats from one position's matrix of `tiles` x `channels` to the next: padded by a cache
// line, since strides of a multiple of 4 KiB put all 36 positions in one cache set.
constexpr std::size_t wino_plane(std::size_t tiles, std::size_t channels) { return tiles * channels + 16; }

struct WinogradKernels {
  // u[xi][ic][oc] = (G w G^T)[xi] of each filter of w (state dict, 64x32x3x3).
  void (*weights)(const float* w, float* u);
  // v[xi][t][ic] (planes wino_plane apart) = (B^T d B)[xi] of each 6x6 tile d of `images` images of a1.
  void (*input)(const float* a1, std::uint32_t images, float* v);
  // z[xi][t][oc] = (A dy A^T)[xi] of each 4x4 tile dy of d_a2; adds d_a2's per-channel
  // sums (the bias gradient) to db[64].
  void (*output_grad)(const float* d_a2, std::uint32_t images, float* z, double* db);
  // The same with the 2x2 max pool's backward (pool.hpp) fused in: dy is routed from
  // d_pool (images x 64 x 12 x 12) to each window's argmax, as the pool's backward
  // writes d_a2, and no d_a2 map is written. The same bits as the two passes.
  void (*pooled_output_grad)(const float* d_pool, const std::uint8_t* argmax, std::uint32_t images, float* z,
                             double* db);
  // d_a1 = the sum over overlapping tiles of (B dv B^T): dv[xi][t][ic]; all of d_a1 written.
  void (*input_grad)(const float* dv, std::uint32_t images, float* d_a1);
  // dw (state dict) = (G^T du G) of du[xi][ic][oc].
  void (*weights_grad)(const float* du, float* dw);
};

WinogradKernels winograd_kernels(Isa isa);

}  // namespace mnist_mt::cpu
