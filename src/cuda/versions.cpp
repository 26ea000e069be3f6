#include <cuda_runtime_api.h>
#include <cudnn_version.h>
#include <nccl.h>

#include <string>

#include "mnist_mt/version.hpp"

namespace mnist_mt {

std::vector<LibraryVersion> cuda_library_versions() {
  const auto dotted = [](int a, int b, int c) {
    return std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(c);
  };
  // CUDART_VERSION is 1000 * major + 10 * minor.
  return {{"CUDA", std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10)},
          {"cuDNN", dotted(CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL)},
          {"NCCL", dotted(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)}};
}

}  // namespace mnist_mt
