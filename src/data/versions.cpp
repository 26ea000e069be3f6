#include <curl/curl.h>
#include <openssl/opensslv.h>
#include <png.h>
#include <zlib.h>

#include <oneapi/tbb/version.h>

#include "mnist_mt/version.hpp"

namespace mnist_mt {

std::vector<LibraryVersion> data_library_versions() {
  return {{"oneTBB", TBB_VERSION_STRING},
          {"libcurl", LIBCURL_VERSION},
          {"OpenSSL", OPENSSL_VERSION_STR},
          {"libpng", PNG_LIBPNG_VER_STRING},
          {"zlib", ZLIB_VERSION}};
}

}  // namespace mnist_mt
