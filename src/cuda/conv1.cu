// conv1 (1 -> 32 channels, 3x3) in two kernels of our own instead of cuDNN's calls and the
// bias, ReLU and bias-gradient kernels around them: one input channel makes each output
// nine multiply-adds, and each weight gradient a sum over the batch's positions.
// Forward: an element a thread, bias and ReLU included (element_ops.hpp). Backward: a block
// per plane (row, channel) adds its ten sums (nine taps and the bias, ReLU's backward
// applied) in a fixed tree order, and the block that finishes last adds the planes' sums
// over the rows in order in double: the same bits on every run.
#include "block_sum.cuh"
#include "element_ops.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void conv1_forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                            const float* __restrict__ b, std::size_t count, float* __restrict__ out) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) out[i] = conv1_forward_at(x, w, b, i);
}

void conv1_forward(const float* x, const float* w, const float* b, std::uint32_t rows, float* out,
                   StreamHandle stream) {
  const std::size_t count = std::size_t{rows} * kConv1Planes * kConv1Positions;
  if (count == 0) return;
  conv1_forward_kernel<<<grid_for(count), kBlock, 0, stream>>>(x, w, b, count, out);
  CHECK_LAUNCH();
}

static __global__ void __launch_bounds__(kConv1Block)
    conv1_backward_kernel(const float* __restrict__ x, const float* __restrict__ out, const float* __restrict__ d_out,
                          std::uint32_t rows, float* partial, unsigned* ticket, float* __restrict__ dw,
                          float* __restrict__ db) {
  __shared__ float warps[kConv1Block / kWarp][kConv1Sums];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  float sums[kConv1Sums];
  conv1_grad_share(x, out, d_out, blockIdx.x, static_cast<int>(threadIdx.x), kConv1Block, sums);
  for (int k = 0; k < kConv1Sums; ++k) {
    float v = sums[k];
    for (int h = kWarp / 2; h > 0; h /= 2) v += __shfl_down_sync(0xffffffffu, v, h);
    if (lane == 0) warps[warp][k] = v;
  }
  __syncthreads();
  if (threadIdx.x < kConv1Sums) {
    float total = warps[0][threadIdx.x];
    for (int w = 1; w < kConv1Block / kWarp; ++w) total += warps[w][threadIdx.x];
    partial[std::size_t{blockIdx.x} * kConv1Sums + threadIdx.x] = total;
  }
  if (!last_block_done(ticket)) return;
  for (int j = static_cast<int>(threadIdx.x); j < kConv1Planes * kConv1Sums; j += kConv1Block)
    conv1_grad_total_at(partial, rows, j, dw, db);
}

void conv1_backward(const float* x, const float* out, const float* d_out, std::uint32_t rows, float* partial,
                    unsigned* ticket, float* dw, float* db, StreamHandle stream) {
  if (rows == 0) return;
  conv1_backward_kernel<<<rows * kConv1Planes, kConv1Block, 0, stream>>>(x, out, d_out, rows, partial, ticket, dw,
                                                                         db);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
