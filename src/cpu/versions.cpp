#include <oneapi/dnnl/dnnl_version.h>

#include <string>

#include "mnist_mt/version.hpp"

namespace mnist_mt {

std::vector<LibraryVersion> cpu_library_versions() {
  return {{"oneDNN", std::to_string(DNNL_VERSION_MAJOR) + "." + std::to_string(DNNL_VERSION_MINOR) + "." +
                         std::to_string(DNNL_VERSION_PATCH)}};
}

}  // namespace mnist_mt
