#pragma once
#include <cstdint>
#include <map>
#include <memory>

#include "aligned.hpp"
#include "plan_builder.hpp"

namespace mnist_mt::cpu {

// Adds fc1 (ReLU fused) and fc2, forward and both backward passes, to `plan`.
void add_fc(PlanBuilder& b, Plan& plan, const Buffers& buf, float* params, float* grads);

// fc1's backward_weights over `rows` rows of its input `flat` (kFlat floats a row) and of
// the gradient at its output `d_hidden` (kHidden a row), buffers of `capacity` rows, into
// fc1's weight and bias gradients in `grads`: one primitive for both passes below.
Step fc1_backward_weights(PlanBuilder& b, Dim rows, float* flat, float* d_hidden, std::size_t capacity,
                          float* grads);
// --exchange factors (Replica::exchange_factors): buffers for every rank's fc1 factors,
// `world` x max_batch rows of input (kFlat) and of output gradient (kHidden), and the
// plans of fc1's weight and bias gradients over the first rows of them, by row count.
class Fc1Factors {
 public:
  Fc1Factors(int world, std::uint32_t max_batch);
  int world() const { return world_; }
  std::uint32_t capacity() const { return capacity_; }  // rows
  float* inputs() { return inputs_.get(); }
  float* output_grads() { return output_grads_.get(); }
  // The plan over `rows` rows, or null until add() has it. add() builds it, into `grads`,
  // on the calling thread (the replica's compute thread).
  Plan* find(std::uint32_t rows);
  Plan& add(const dnnl::engine& engine, std::uint32_t rows, float* grads);
  // fc1's gradients over the plan's rows averaged over the world: the world's division
  // on the gathered output gradients, before the product, rather than on its 1.18 M
  // results (exact when the world is a power of two, so that 1 rank x `rows` gives the
  // same bits).
  void run(const Plan& plan, dnnl::stream& stream);
  void clear() { plans_.clear(); }  // on the thread that built them

 private:
  int world_;
  std::uint32_t capacity_;
  Aligned<float> inputs_, output_grads_;
  std::map<std::uint32_t, std::unique_ptr<Plan>> plans_;
};

}  // namespace mnist_mt::cpu
