#pragma once
#include "isa.hpp"
#include "plan_builder.hpp"

namespace mnist_mt::cpu {

// Adds conv2's forward (bias, no ReLU: the pooling applies it) and the reorder of its
// weights into oneDNN's layout to `plan`.
void add_conv2_forward(PlanBuilder& b, Plan& plan, const Buffers& buf, Isa isa, float* params);

}  // namespace mnist_mt::cpu
