// The fused SGD-momentum update over the flat parameter buffer. Explicit roundings keep
// PyTorch's order of operations (no fused multiply-add).
#include "kernels.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void sgd_kernel(float* __restrict__ params, const float* __restrict__ grads,
                                  float* __restrict__ momentum, std::size_t count, SgdArgs args) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) {
    const float p = params[i];
    float d = grads[i];
    if (args.weight_decay != 0.0f) d = __fadd_rn(d, __fmul_rn(args.weight_decay, p));
    const float buf = args.first ? d : __fadd_rn(__fmul_rn(args.momentum, momentum[i]), d);
    momentum[i] = buf;
    params[i] = __fadd_rn(p, __fmul_rn(-args.lr, buf));
  }
}

void sgd_update(float* params, const float* grads, float* momentum, std::size_t count, const SgdArgs& args,
                StreamHandle stream) {
  if (count == 0) return;
  sgd_kernel<<<grid_for(count), kBlock, 0, stream>>>(params, grads, momentum, count, args);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
