#pragma once
// MD5 digests, as the published data set checksums are (OpenSSL's implementation).
#include <cstdint>
#include <span>
#include <string>

namespace mnist_mt {

// Lower-case hex, 32 characters.
std::string md5_hex(std::span<const std::uint8_t> bytes);

}  // namespace mnist_mt
