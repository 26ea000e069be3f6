#include <curl/curl.h>
#include <openssl/opensslv.h>

#include "mnist_mt/version.hpp"

namespace mnist_mt {

std::vector<LibraryVersion> fetch_library_versions() {
  return {{"libcurl", LIBCURL_VERSION}, {"OpenSSL", OPENSSL_VERSION_STR}};
}

}  // namespace mnist_mt
