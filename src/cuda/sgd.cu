// The fused SGD-momentum update over the flat parameter buffer (element_ops.hpp: sgd_at,
// whose explicit roundings keep PyTorch's order of operations, no fused multiply-add),
// and the device-side decision of a guarded update.
#include <cmath>

#include "element_ops.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void sgd_kernel(float* __restrict__ params, const float* __restrict__ grads,
                                  float* __restrict__ momentum, std::size_t count, SgdArgs args,
                                  const int* __restrict__ gate, const int* __restrict__ first) {
  if (gate != nullptr && *gate == 0) return;
  if (first != nullptr) args.first = *first != 0;
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) sgd_at(params, grads, momentum, i, args);
}

void sgd_update(float* params, const float* grads, float* momentum, std::size_t count, const SgdArgs& args,
                StreamHandle stream, const int* gate, const int* first) {
  if (count == 0) return;
  sgd_kernel<<<grid_for(count), kBlock, 0, stream>>>(params, grads, momentum, count, args, gate, first);
  CHECK_LAUNCH();
}

static __global__ void begin_update_kernel(int* state, const int* gate) {
  state[kMomentumFirst] = state[kMomentumStarted] == 0 ? 1 : 0;
  if (gate == nullptr || *gate != 0) state[kMomentumStarted] = 1;
}

void begin_update(int* state, const int* gate, StreamHandle stream) {
  begin_update_kernel<<<1, 1, 0, stream>>>(state, gate);
  CHECK_LAUNCH();
}

static __device__ void commit_pending(double* stats) {
  for (int i = 0; i < 3; ++i) {
    stats[kStatLoss + i] += stats[kStatPending + i];
    stats[kStatPending + i] = 0;
  }
}

static __global__ void decide_kernel(double* stats, const double* squares, std::uint64_t first_step, bool halt,
                                     int* gate) {
  const double step = static_cast<double>(first_step) + stats[kStatUpdates];
  stats[kStatUpdates] += 1;
  const double norm = sqrt(*squares);
  const bool apply = stats[kStatHalted] == 0 && isfinite(norm) && isfinite(stats[kStatPending + 0]);
  *gate = apply ? 1 : 0;
  if (apply) {
    commit_pending(stats);
    return;
  }
  stats[kStatSkipped] += 1;
  // A halted replica's later steps are dropped whatever they hold.
  if (stats[kStatHalted] == 0 && stats[kStatNonFinite] == 0) {
    stats[kStatNonFinite] = 1;
    stats[kStatNonFiniteStep] = step;
    stats[kStatNonFiniteLoss] = stats[kStatPending + 0];
    stats[kStatNonFiniteNorm] = norm;
  }
  for (int i = 0; i < 3; ++i) stats[kStatPending + i] = 0;
  if (halt) stats[kStatHalted] = 1;
}

void decide_update(double* stats, const double* squares, std::uint64_t first_step, bool halt, int* gate,
                   StreamHandle stream) {
  decide_kernel<<<1, 1, 0, stream>>>(stats, squares, first_step, halt, gate);
  CHECK_LAUNCH();
}

static __global__ void commit_kernel(double* stats) { commit_pending(stats); }

void commit_stats(double* stats, StreamHandle stream) {
  commit_kernel<<<1, 1, 0, stream>>>(stats);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
