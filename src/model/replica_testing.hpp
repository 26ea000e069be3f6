#pragma once
// Test-only seam of Replica, kept out of the public interface: the gradients of the
// last backward pass, copied to the host.
#include <span>

#include "mnist_mt/replica.hpp"

namespace mnist_mt {

struct ReplicaTesting {
  static void read_grads(Replica& replica, std::span<float> out) { replica.read_grads(out); }
};

}  // namespace mnist_mt
