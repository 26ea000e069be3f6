#include <zlib.h>

#include <oneapi/tbb/version.h>

#include "mnist_mt/version.hpp"

namespace mnist_mt {

std::vector<LibraryVersion> data_library_versions() {
  return {{"oneTBB", TBB_VERSION_STRING}, {"zlib", ZLIB_VERSION}};
}

}  // namespace mnist_mt
