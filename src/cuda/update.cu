// The optimizer's update over the flat parameter buffer (optimizer.hpp's element
// functions, whose explicit roundings keep PyTorch's order of operations, no fused
// multiply-add), its per-update scalars, and the device-side decision of a guarded update.
#include <cmath>

#include "element_ops.hpp"
#include "launch.cuh"
#include "squares.cuh"

namespace mnist_mt::cuda {

static __global__ void write_values_kernel(double* values, double lr, double momentum) {
  values[0] = lr;
  values[1] = momentum;
}

void write_update_values(double* values, double lr, double momentum, StreamHandle stream) {
  write_values_kernel<<<1, 1, 0, stream>>>(values, lr, momentum);
  CHECK_LAUNCH();
}

static __device__ void begin_at(const OptimizerOptions& options, const double* values, unsigned long long* applied,
                                const int* gate, UpdateScalars* scalars) {
  *scalars = update_scalars(options, UpdateValues{values[0], values[1]}, *applied);
  if (gate == nullptr || *gate != 0) *applied += 1;
}

static __global__ void begin_update_kernel(OptimizerOptions options, const double* values,
                                           unsigned long long* applied, const int* gate, UpdateScalars* scalars) {
  begin_at(options, values, applied, gate, scalars);
}

void begin_update(const OptimizerOptions& options, const double* values, unsigned long long* applied, const int* gate,
                  UpdateScalars* scalars, StreamHandle stream) {
  begin_update_kernel<<<1, 1, 0, stream>>>(options, values, applied, gate, scalars);
  CHECK_LAUNCH();
}

static __global__ void update_kernel(float* __restrict__ params, const float* __restrict__ grads,
                                     float* __restrict__ first, float* __restrict__ second, std::size_t count,
                                     const UpdateScalars* __restrict__ scalars, const int* __restrict__ gate) {
  if (gate != nullptr && *gate == 0) return;
  const UpdateScalars s = *scalars;
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) update_at(params, grads, first, second, i, s);
}

void optimizer_update(float* params, const float* grads, float* first, float* second, std::size_t count,
                      const UpdateScalars* scalars, StreamHandle stream, const int* gate) {
  if (count == 0) return;
  update_kernel<<<grid_for(count), kBlock, 0, stream>>>(params, grads, first, second, count, scalars, gate);
  CHECK_LAUNCH();
}

static __device__ void commit_pending(double* stats) {
  for (int i = 0; i < 3; ++i) {
    stats[kStatLoss + i] += stats[kStatPending + i];
    stats[kStatPending + i] = 0;
  }
}

static __device__ void decide_at(double* stats, double squares, std::uint64_t first_step, bool halt, int* gate) {
  const double step = static_cast<double>(first_step) + stats[kStatUpdates];
  stats[kStatUpdates] += 1;
  const double norm = sqrt(squares);
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

// kSquareBlocks blocks: each adds its share of the squares, and the block that finishes
// last (last_block_done) adds the partial sums and decides.
static __global__ void guard_update_kernel(const float* __restrict__ grads, std::size_t count, double* scratch,
                                           unsigned* ticket, GuardArgs guard, OptimizerOptions options,
                                           const double* values, unsigned long long* applied, UpdateScalars* scalars) {
  __shared__ double shared[kBlock];
  const double partial = block_partial_squares(grads, count, shared);
  if (threadIdx.x == 0) scratch[blockIdx.x] = partial;
  if (!last_block_done(ticket)) return;
  const double squares = total_of_partials(scratch, gridDim.x, shared);
  if (threadIdx.x != 0) return;
  scratch[gridDim.x] = squares;
  decide_at(guard.stats, squares, guard.first_step, guard.halt, guard.gate);
  begin_at(options, values, applied, guard.gate, scalars);
}

void guard_update(const float* grads, std::size_t count, double* scratch, unsigned* ticket, const GuardArgs& guard,
                  const OptimizerOptions& options, const double* values, unsigned long long* applied,
                  UpdateScalars* scalars, StreamHandle stream) {
  guard_update_kernel<<<kSquareBlocks, kBlock, 0, stream>>>(grads, count, scratch, ticket, guard, options, values,
                                                           applied, scalars);
  CHECK_LAUNCH();
}

static __global__ void commit_kernel(double* stats) { commit_pending(stats); }

void commit_stats(double* stats, StreamHandle stream) {
  commit_kernel<<<1, 1, 0, stream>>>(stats);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
