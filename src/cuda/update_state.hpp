#pragma once
// A CUDA replica's optimizer on the device: the state buffers (OptimizerState's first and
// second, the count of updates applied), the update's values and scalars, and the
// guard's scratch and decision. Every call enqueues on the given stream.
#include <cstdint>
#include <optional>

#include "kernels.hpp"
#include "mnist_mt/optimizer.hpp"
#include "mnist_mt/replica.hpp"
#include "owners.hpp"

namespace mnist_mt::cuda {

class UpdateState {
 public:
  UpdateState();

  // The state, the count of updates and the guard's count of finished blocks, zeroed.
  void zero(StreamHandle stream);
  // The next update's learning rate and momentum (or beta1), written into device memory
  // unless already there: a recorded step reads them there at each replay.
  void set_values(const OptimizerOptions& options, StreamHandle stream);
  // The update of params from grads. Its scalars are made on the device from the values
  // there and the updates applied, so that a recorded step replays right: the values are
  // written here (unless already there) when not `recording`; when recording, the caller
  // writes them before each replay (set_values).
  void apply(float* params, const float* grads, const OptimizerOptions& options, bool recording,
             StreamHandle stream);
  // As apply(), gated by the guard's decision on the device (guard_update: two kernels).
  void apply_guarded(float* params, const float* grads, const OptimizerOptions& options, const UpdateGuard& guard,
                     double* stats, bool recording, StreamHandle stream);
  // Enqueues the sum of squares of grads; total() is where it lands.
  void sum_squares(const float* grads, StreamHandle stream);
  const double* total() const { return squares_.data() + kSquareBlocks; }

  DeviceBuffer<float>& first() { return first_; }
  DeviceBuffer<float>& second() { return second_; }
  unsigned long long* applied() { return applied_.data(); }

 private:
  DeviceBuffer<float> first_, second_;        // OptimizerState::first, second
  DeviceBuffer<unsigned long long> applied_;  // updates applied
  DeviceBuffer<double> values_;               // the next update's learning rate and momentum
  std::optional<UpdateValues> written_;       // what values_ was last set to, in stream order
  DeviceBuffer<UpdateScalars> scalars_;       // the update's, from begin_update or guard_update
  DeviceBuffer<double> squares_;              // the squares' partial sums and total
  DeviceBuffer<unsigned> ticket_;             // guard_update's count of finished blocks
  DeviceBuffer<int> gate_;                    // the guard's decision
};

}  // namespace mnist_mt::cuda
