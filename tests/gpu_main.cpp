// main() of the GPU test binaries. Where no CUDA device is present, only the tests of
// suites whose name ends in "Anywhere" run, and a binary whose tests then pass exits 77,
// which meson reports as skipped: a host without a GPU never counts the GPU tests as
// passed. tests/gpu/run_gpu_suite.sh counts any skip as a failure.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <iostream>

namespace {

int cuda_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace

int main(int argc, char** argv) {
  // CUDA_MODULE_LOADING and CUDA_DEVICE_MAX_CONNECTIONS stay as the environment has them:
  // ranks that share a GPU order their work by recorded events only, whatever the
  // hardware queues or the loading of kernels.
  testing::InitGoogleTest(&argc, argv);
  if (cuda_devices() > 0) return RUN_ALL_TESTS();
  std::cout << "no CUDA device: running only the *Anywhere tests, then reporting the binary as skipped\n";
  GTEST_FLAG_SET(filter, "*Anywhere.*");
  const int failed = RUN_ALL_TESTS();
  return failed != 0 ? failed : 77;
}
