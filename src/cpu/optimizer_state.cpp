#include "optimizer_state.hpp"

#include <cstring>

#include "kernels.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cpu {

OptimizerBuffers::OptimizerBuffers()
    : first_(aligned_zeros<float>(kParamCount)), second_(aligned_zeros<float>(kParamCount)) {}

void OptimizerBuffers::update(float* params, const float* grads, Fc1Factors* factors,
                              const OptimizerOptions& options) {
  const UpdateScalars scalars = update_scalars(options, base_values(options), applied_);
  if (factors != nullptr && factors->pending())
    factors->update(params, grads, first_.get(), second_.get(), scalars);
  else
    optimizer_update(params, grads, first_.get(), second_.get(), kParamCount, scalars);
  ++applied_;
}

OptimizerState OptimizerBuffers::read() const {
  OptimizerState state;
  state.first.assign(first_.get(), first_.get() + kParamCount);
  state.second.assign(second_.get(), second_.get() + kParamCount);
  state.applied = applied_;
  return state;
}

void OptimizerBuffers::write(const OptimizerState& state) {
  if (!state.first.empty()) std::memcpy(first_.get(), state.first.data(), kParamCount * sizeof(float));
  if (!state.second.empty()) std::memcpy(second_.get(), state.second.data(), kParamCount * sizeof(float));
  applied_ = state.applied;
}

}  // namespace mnist_mt::cpu
