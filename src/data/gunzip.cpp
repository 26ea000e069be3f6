#include "gunzip.hpp"

#include <zlib.h>

#include <limits>

namespace mnist_mt {

bool is_gzip(std::span<const std::uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

std::optional<std::vector<std::uint8_t>> gunzip(std::span<const std::uint8_t> bytes, std::size_t max_bytes) {
  if (bytes.size() > std::numeric_limits<uInt>::max()) return std::nullopt;
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) return std::nullopt;  // +16: the gzip wrapper
  struct End {
    z_stream* zs;
    ~End() { inflateEnd(zs); }
  } end{&zs};
  zs.next_in = const_cast<Bytef*>(bytes.data());
  zs.avail_in = static_cast<uInt>(bytes.size());
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  std::vector<std::uint8_t> out;
  while (out.size() <= max_bytes) {
    const std::size_t old = out.size();
    out.resize(old + kChunk);
    zs.next_out = out.data() + old;
    zs.avail_out = static_cast<uInt>(kChunk);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out.resize(old + (kChunk - zs.avail_out));
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0) return out.size() <= max_bytes ? std::optional(std::move(out)) : std::nullopt;
      // Another member follows: concatenated gzip files decompress to the concatenation.
      if (inflateReset(&zs) != Z_OK) return std::nullopt;
    } else if (rc != Z_OK) {
      return std::nullopt;  // corrupt, or Z_BUF_ERROR: the input ended inside the stream
    }
  }
  return std::nullopt;
}

}  // namespace mnist_mt
