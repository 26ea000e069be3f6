// Builds without the CUDA backend: --gpus is an input error, not a crash.
#include "mnist_mt/backend.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  throw InputError("--gpus: this build has no CUDA backend");
}

bool cuda_built() { return false; }

}  // namespace mnist_mt
