#include <png.h>

#include "mnist_mt/version.hpp"

namespace mnist_mt {

std::vector<LibraryVersion> image_library_versions() { return {{"libpng", PNG_LIBPNG_VER_STRING}}; }

}  // namespace mnist_mt
