// Builds without the CUDA backend: asking for it is an input error, not a crash.
#include "mnist_mt/backend.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/version.hpp"

namespace mnist_mt {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  throw InputError("this build has no CUDA backend", "backend");
}

bool cuda_built() { return false; }

std::vector<LibraryVersion> cuda_library_versions() {
  return {{"CUDA", "not built"}, {"cuDNN", "not built"}, {"NCCL", "not built"}};
}

}  // namespace mnist_mt
