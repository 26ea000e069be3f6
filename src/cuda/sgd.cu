// The fused SGD-momentum update over the flat parameter buffer (element_ops.hpp: sgd_at,
// whose explicit roundings keep PyTorch's order of operations, no fused multiply-add).
#include "element_ops.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void sgd_kernel(float* __restrict__ params, const float* __restrict__ grads,
                                  float* __restrict__ momentum, std::size_t count, SgdArgs args) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) sgd_at(params, grads, momentum, i, args);
}

void sgd_update(float* params, const float* grads, float* momentum, std::size_t count, const SgdArgs& args,
                StreamHandle stream) {
  if (count == 0) return;
  sgd_kernel<<<grid_for(count), kBlock, 0, stream>>>(params, grads, momentum, count, args);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
