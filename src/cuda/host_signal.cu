// The stream side of host_signal.hpp.
#include "host_signal.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

// volatile: every poll reads host memory again. The sleep keeps the PCIe reads sparse;
// a microsecond is small against a staged copy of a gradient bucket.
static __global__ void wait_for_host_kernel(const volatile std::uint32_t* word, std::uint32_t value) {
  while (*word < value) __nanosleep(1000);
}

void wait_for_host(const std::uint32_t* word, std::uint32_t value, CUstream_st* stream) {
  wait_for_host_kernel<<<1, 1, 0, stream>>>(word, value);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
