#include "update_state.hpp"

#include "errors.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cuda {

UpdateState::UpdateState()
    : first_(kParamCount),
      second_(kParamCount),
      applied_(1),
      values_(2),
      scalars_(1),
      squares_(kSquareScratch),
      ticket_(1),
      gate_(1) {}

void UpdateState::zero(StreamHandle stream) {
  for (const DeviceBuffer<float>* b : {&first_, &second_})
    CUDA_CHECK(cudaMemsetAsync(b->data(), 0, b->bytes(), stream));
  CUDA_CHECK(cudaMemsetAsync(applied_.data(), 0, applied_.bytes(), stream));
  CUDA_CHECK(cudaMemsetAsync(ticket_.data(), 0, ticket_.bytes(), stream));
}

void UpdateState::set_values(const OptimizerOptions& options, StreamHandle stream) {
  const UpdateValues v = base_values(options);
  if (written_ && written_->lr == v.lr && written_->momentum == v.momentum) return;
  write_update_values(values_.data(), v.lr, v.momentum, stream);
  written_ = v;
}

void UpdateState::apply(float* params, const float* grads, const OptimizerOptions& options, bool recording,
                        StreamHandle stream) {
  if (!recording) set_values(options, stream);
  begin_update(options, values_.data(), applied_.data(), nullptr, scalars_.data(), stream);
  optimizer_update(params, grads, first_.data(), second_.data(), kParamCount, scalars_.data(), stream);
}

void UpdateState::apply_guarded(float* params, const float* grads, const OptimizerOptions& options,
                                const UpdateGuard& guard, double* stats, bool recording, StreamHandle stream) {
  if (!recording) set_values(options, stream);
  guard_update(grads, kParamCount, squares_.data(), ticket_.data(), {stats, guard.first_step, guard.halt, gate_.data()},
               options, values_.data(), applied_.data(), scalars_.data(), stream);
  optimizer_update(params, grads, first_.data(), second_.data(), kParamCount, scalars_.data(), stream, gate_.data());
}

void UpdateState::sum_squares(const float* grads, StreamHandle stream) {
  sum_of_squares(grads, kParamCount, squares_.data(), stream);
}

}  // namespace mnist_mt::cuda
