#pragma once
// A CUDA replica's activations and their gradients for max_batch rows (NCHW, as
// geometry.hpp sizes them), and the scratch of the kernels that reduce over them.
#include <cstdint>

#include "errors.hpp"
#include "geometry.hpp"
#include "kernels.hpp"
#include "owners.hpp"

namespace mnist_mt::cuda {

struct Activations {
  explicit Activations(std::uint32_t max_batch)
      : x(std::size_t{max_batch} * kImageBytes),
        a1(std::size_t{max_batch} * kA1),
        a2(std::size_t{max_batch} * kA2),
        pooled(std::size_t{max_batch} * kFc1In),
        h(std::size_t{max_batch} * kFc1Out),
        z(std::size_t{max_batch} * kFc2Out),
        logprobs(std::size_t{max_batch} * kFc2Out),
        dlogits(std::size_t{max_batch} * kFc2Out),
        dh(std::size_t{max_batch} * kFc1Out),
        dpooled(std::size_t{max_batch} * kFc1In),
        da2(std::size_t{max_batch} * kA2),
        da1(std::size_t{max_batch} * kA1),
        conv1_sums(std::size_t{max_batch} * kC1 * kConv1Sums),
        conv1_ticket(1),
        pool_sums(std::size_t{max_batch} * kC2),
        pool_ticket(1) {}

  // The reducing kernels' counts of finished blocks, zeroed (their first use's state).
  void zero_tickets(StreamHandle stream) {
    for (const DeviceBuffer<unsigned>* t : {&conv1_ticket, &pool_ticket})
      CUDA_CHECK(cudaMemsetAsync(t->data(), 0, t->bytes(), stream));
  }

  DeviceBuffer<float> x, a1, a2, pooled, h, z, logprobs, dlogits;
  DeviceBuffer<float> dh, dpooled, da2, da1;
  DeviceBuffer<float> conv1_sums;       // conv1_backward's sums of each plane
  DeviceBuffer<unsigned> conv1_ticket;  // and its count of finished blocks
  DeviceBuffer<float> pool_sums;        // max_pool_dropout_backward's bias sums of each plane
  DeviceBuffer<unsigned> pool_ticket;   // and its count of finished blocks
};

}  // namespace mnist_mt::cuda
