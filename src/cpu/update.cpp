// The optimizer's update over the flat buffers, per instruction set (simd.hpp).
#include "kernels.hpp"

#include "simd.hpp"
#include "whole_ranges.hpp"

namespace mnist_mt::cpu {
namespace {

// One update of the optimizer over the flat buffers (optimizer.hpp's element functions).
// The scalars are copied first: stores to the float buffers could otherwise alias them,
// which keeps GCC from hoisting their tests out of the loops and vectorising.
template <std::size_t>  // auto-vectorised
[[gnu::always_inline]] inline void update_body(float* params, const float* grads, float* first, float* second,
                                               std::size_t count, const UpdateScalars& scalars) {
  const UpdateScalars s = scalars;
  whole_ranges::reads(grads, count);
  whole_ranges::writes(params, count);
  if (s.kind != OptimizerKind::kSgd || s.momentum != 0.0f) whole_ranges::writes(first, count);
  if (s.kind != OptimizerKind::kSgd) whole_ranges::writes(second, count);
  switch (s.kind) {
    case OptimizerKind::kSgd:
      for (std::size_t i = 0; i < count; ++i) sgd_at(params, grads, first, i, s);
      return;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      for (std::size_t i = 0; i < count; ++i) adam_at(params, grads, first, second, i, s);
      return;
    case OptimizerKind::kAdadelta:
      for (std::size_t i = 0; i < count; ++i) adadelta_at(params, grads, first, second, i, s);
      return;
  }
}

MNIST_MT_ISA_VARIANTS(update, update_body,
                      (float* params, const float* grads, float* first, float* second, std::size_t count,
                       const UpdateScalars& scalars),
                      (params, grads, first, second, count, scalars))
}  // namespace

OptimizerUpdateFn optimizer_update_variant(Isa isa) {
  return pick<OptimizerUpdateFn>(isa, update_avx512, update_avx2, update_portable);
}

}  // namespace mnist_mt::cpu
