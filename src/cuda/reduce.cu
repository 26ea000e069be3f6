// The local group's reduction over buffers of one GPU, in the CPU backend's order: each
// element adds the inputs one after another, so ranks that share a GPU sum as CPU ranks do.
#include "kernels.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {
namespace {

// By value: a launch carries the pointers, so nothing is copied to the device first.
struct Buffers {
  const float* in[kReduceBuffers];
  float* out[kReduceBuffers];
};

}  // namespace

static __global__ void reduce_in_order_kernel(Buffers b, unsigned inputs, unsigned outputs, std::size_t count,
                                              bool average, bool by_inverse, float inverse, float divisor) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) {
    float acc = b.in[0][i];
    for (unsigned s = 1; s < inputs; ++s) acc = __fadd_rn(acc, b.in[s][i]);
    // Correctly rounded either way, as the host's x * (1/W) and x / W.
    if (average) acc = by_inverse ? __fmul_rn(acc, inverse) : __fdiv_rn(acc, divisor);
    for (unsigned o = 0; o < outputs; ++o) b.out[o][i] = acc;
  }
}

void reduce_in_order(const float* const* in, std::size_t inputs, float* const* out, std::size_t outputs,
                     std::size_t count, bool average, std::size_t divisor, StreamHandle stream) {
  if (count == 0) return;
  Buffers b{};
  for (std::size_t s = 0; s < inputs; ++s) b.in[s] = in[s];
  for (std::size_t o = 0; o < outputs; ++o) b.out[o] = out[o];
  const bool by_inverse = (divisor & (divisor - 1)) == 0;
  reduce_in_order_kernel<<<grid_for(count), kBlock, 0, stream>>>(
      b, static_cast<unsigned>(inputs), static_cast<unsigned>(outputs), count, average, by_inverse,
      1.0f / static_cast<float>(divisor), static_cast<float>(divisor));
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
