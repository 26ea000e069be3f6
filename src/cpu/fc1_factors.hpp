#pragma once
// --exchange factors on a CPU replica (Replica::exchange_factors): buffers for every rank's
// fc1 factors, `world` x max_batch rows of input X (kFlat floats) and of output gradient G
// (kHidden), and fc1's gradients formed from them. fc1's weight gradient G^T X (128 x 9216)
// is not written whole in a training step: its norm comes from the factors (squares()),
// and the update takes it in chunks of rows as the product makes them, each while it is in
// cache (update()). materialize() writes it whole, for those who read the gradients.
#include <cstdint>

#include "aligned.hpp"
#include "mnist_mt/optimizer.hpp"

namespace mnist_mt::cpu {

class Fc1Factors {
 public:
  Fc1Factors(int world, std::uint32_t max_batch);
  int world() const { return world_; }
  std::uint32_t capacity() const { return capacity_; }  // rows
  float* inputs() { return inputs_.get(); }
  float* output_grads() { return output_grads_.get(); }

  // Compute thread, once the allgathers are done: fc1's gradients are those of the first
  // `rows` gathered rows, averaged over the world (G divided by it, exact when the world is
  // a power of two, so 1 rank x `rows` gives the same bits). Writes fc1's bias gradient
  // (the column sums of G, in row order) into `grads` (the flat gradients), and over 16
  // rows the weight gradient too (materialize()).
  void take(std::uint32_t rows, float* grads);
  // Whether take()'s weight gradient is only in the factors (until materialize(); the
  // next allgather overwrites them, so it is the step's own until its next take()).
  bool pending() const { return rows_ > 0; }
  // The flat gradients' sum of squares, fc1's weight gradient's from the factors
  // (sum over row pairs of (g_a . g_b)(x_a . x_b), the same on every ISA).
  double squares(const float* grads) const;
  // The optimizer's update of every parameter, fc1's weights chunk by chunk from the
  // factors (the bits of optimizer_update on the whole product).
  void update(float* params, const float* grads, float* first, float* second, const UpdateScalars& scalars);
  // Writes fc1's weight gradient into `grads`. Not pending after it.
  void materialize(float* grads);

 private:
  int world_;
  std::uint32_t capacity_;
  std::uint32_t rows_ = 0;  // take()'s rows while pending
  Aligned<float> inputs_, output_grads_, chunk_;
};

}  // namespace mnist_mt::cpu
