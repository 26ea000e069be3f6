#pragma once
#include "plan_builder.hpp"

namespace mnist_mt::cpu {

// Whether fc1's forward at `batch` is ours (fc1_forward in kernels.hpp) rather than
// oneDNN's inner product on `isa`.
bool own_fc1_forward(Isa isa, std::uint32_t batch);
// fc1's forward (ReLU fused) of `plan`'s batch, ours or oneDNN's (own_fc1_forward): the
// hidden activations from the flattened pool and the parameters (fc1's weights and bias).
void fc1_forward(const Plan& plan, const Buffers& buf, const float* params, const dnnl::stream& stream);

// Whether fc1's backward passes at `batch` are ours (fc1_backward_weights,
// fc1_backward_data in kernels.hpp) rather than oneDNN's inner products on `isa`.
bool own_fc1_backward(Isa isa, std::uint32_t batch);

// fc1's backward passes of `plan`'s batch, ours or oneDNN's (own_fc1_backward): the
// weight and bias gradients into `grads` (the flat gradients), the data gradient d_flat.
void fc1_backward_weights(const Plan& plan, const Buffers& buf, float* grads, const dnnl::stream& stream);
void fc1_backward_data(const Plan& plan, const Buffers& buf, const float* params, const dnnl::stream& stream);

// Adds fc1 (ReLU fused) and fc2, forward and both backward passes, to `plan` (fc1's
// passes only where oneDNN runs them).
void add_fc(PlanBuilder& b, Plan& plan, const Buffers& buf, Isa isa, float* params, float* grads);

}  // namespace mnist_mt::cpu
