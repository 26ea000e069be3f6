#pragma once
#include "plan_builder.hpp"

namespace mnist_mt::cpu {

// Adds fc1 (ReLU fused) and fc2, forward and both backward passes, to `plan`.
void add_fc(PlanBuilder& b, Plan& plan, const Buffers& buf, float* params, float* grads);

}  // namespace mnist_mt::cpu
