// conv2's bias and ReLU with the 2x2 max-pool and the dropout after it, forward; the
// max-pool's backward with conv2's bias gradient. One pass each.
#include "block_sum.cuh"
#include "element_ops.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void bias_relu_max_pool_dropout_kernel(float* __restrict__ a2, const float* __restrict__ bias,
                                                         float* __restrict__ out, std::size_t count, int channels,
                                                         int side, DropoutArgs dropout) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    out[i] = bias_relu_max_pool_dropout_at(a2, bias, i, channels, side, dropout);
}

void bias_relu_max_pool_dropout(float* a2, const float* bias, float* out, std::uint32_t rows, int channels, int side,
                                const DropoutArgs& dropout, StreamHandle stream) {
  const std::size_t count = std::size_t(rows) * channels * side * side;
  if (count == 0) return;
  bias_relu_max_pool_dropout_kernel<<<grid_for(count), kBlock, 0, stream>>>(a2, bias, out, count, channels, side,
                                                                           dropout);
  CHECK_LAUNCH();
}

// A block per plane (row, channel): its windows' gradients, and their sum in
// block_tree_sum's order into partial[plane]; the block that finishes last adds the
// planes over the rows (rows_total_at) into db.
static __global__ void __launch_bounds__(kPoolBlock)
    max_pool_dropout_backward_kernel(const float* __restrict__ in, const float* __restrict__ out,
                                     const float* __restrict__ grad_out, float* __restrict__ grad_in,
                                     std::uint32_t rows, int channels, int side, float scale, float* partial,
                                     unsigned* ticket, float* __restrict__ db) {
  __shared__ float warps[kPoolBlock / kWarp];
  const float share = pool_backward_share(in, out, grad_out, grad_in, blockIdx.x, side, scale,
                                          static_cast<int>(threadIdx.x), kPoolBlock);
  const float total = block_tree_sum(share, warps);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
  if (!last_block_done(ticket)) return;
  for (int c = static_cast<int>(threadIdx.x); c < channels; c += kPoolBlock)
    db[c] = rows_total_at(partial, rows, channels, 1, c, 0);
}

void max_pool_dropout_backward(const float* in, const float* out, const float* grad_out, float* grad_in,
                               std::uint32_t rows, int channels, int side, float scale, float* partial,
                               unsigned* ticket, float* db, StreamHandle stream) {
  if (rows == 0 || channels == 0) return;
  max_pool_dropout_backward_kernel<<<rows * static_cast<unsigned>(channels), kPoolBlock, 0, stream>>>(
      in, out, grad_out, grad_in, rows, channels, side, scale, partial, ticket, db);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
