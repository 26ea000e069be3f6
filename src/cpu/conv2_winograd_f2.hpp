#pragma once
// The transforms of conv2's forward by Winograd F(2x2, 3x3): 4x4 input tiles at stride 2
// cover the 26x26 map exactly and give the 24x24 output as 12x12 tiles of 2x2, with 16
// element-wise products per channel pair instead of 36 multiply-adds (Lavin & Gray's
// B, G and A for F(2, 3)). Its rounding is close to a direct convolution's: its
// transforms add at most four terms, and G's halves are exact. The channel sums between
// the transforms are batched matrix products (conv2_forward.hpp). Position xi = 4*row + column of
// a 4x4 tile; tile t = 144*image + 12*tile_row + tile_column. Activations are nChw{B}c.
#include <cstddef>
#include <cstdint>

#include "isa.hpp"

namespace mnist_mt::cpu {

inline constexpr std::size_t kWinoF2Positions = 16, kWinoF2Tiles = 144;  // per 4x4 tile; tiles per image

struct WinogradF2Kernels {
  // u[xi][ic][oc] = (G w G^T)[xi] of each filter of w (state dict, 64x32x3x3).
  void (*weights)(const float* w, float* u);
  // v[xi][t][ic] (planes `plane` floats apart) = (B^T d B)[xi] of each 4x4 tile d of
  // `images` images of a1 (nChw{B}c, 32 x 26 x 26).
  void (*input)(const float* a1, std::uint32_t images, std::size_t plane, float* v);
  // a2 (nChw{B}c, 64 x 24 x 24) = A^T m A + bias of each tile's m[xi][t][oc] (planes
  // `plane` floats apart).
  void (*output)(const float* m, std::uint32_t images, std::size_t plane, const float* bias, float* a2);
};

WinogradF2Kernels winograd_f2_kernels(Isa isa);

}  // namespace mnist_mt::cpu
