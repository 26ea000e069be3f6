// A kernel that only waits: benchmarks queue the work they time behind it.
#include "kernels.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __device__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

static __global__ void spin_kernel(std::uint64_t ns) {
  const std::uint64_t end = global_ns() + ns;
  while (global_ns() < end) __nanosleep(1000);
}

void spin(double microseconds, StreamHandle stream) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<std::uint64_t>(microseconds * 1e3));
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
