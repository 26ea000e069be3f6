#include "errors.hpp"

#include <string>

#include "mnist_mt/error.hpp"

namespace mnist_mt::cuda {

void raise_failure(const char* library, const char* message, const char* expression, const char* function,
                   const char* file, int line) {
  // The device is the thread's current one; asking cannot disturb an earlier error.
  int device = -1;
  const std::string where = cudaGetDevice(&device) == cudaSuccess ? "cuda:" + std::to_string(device) : "cuda:?";
  throw RuntimeFailure(std::string(library) + " error '" + (message ? message : "unknown") + "' in " + expression +
                       " (" + function + " at " + file + ":" + std::to_string(line) + ", " + where + ")");
}

}  // namespace mnist_mt::cuda
