#include "mnist_mt/gunzip.hpp"

#include <algorithm>
#include <limits>
#include <new>

namespace mnist_mt {
namespace {

uInt clamp(std::size_t n) { return static_cast<uInt>(std::min<std::size_t>(n, std::numeric_limits<uInt>::max())); }

constexpr const char* kTrailing = "trailing bytes after the gzip stream that are not a gzip member";

}  // namespace

GzipInflater::GzipInflater() {
  if (inflateInit2(&zs_, 15 + 16) != Z_OK) throw std::bad_alloc();  // +16: the gzip wrapper only
  inflateGetHeader(&zs_, &header_);
}

GzipInflater::~GzipInflater() { inflateEnd(&zs_); }

std::optional<std::string> GzipInflater::inflate(std::span<const std::uint8_t>& in, std::span<std::uint8_t>& out) {
  while (!out.empty()) {
    if (between_members_) {
      if (in.empty()) return std::nullopt;  // the input may end here
      // Another member follows: concatenated gzip files decompress to the concatenation.
      inflateReset(&zs_);
      header_ = {};
      inflateGetHeader(&zs_, &header_);
      between_members_ = false;
    }
    zs_.next_in = const_cast<Bytef*>(in.data());
    zs_.avail_in = clamp(in.size());
    zs_.next_out = out.data();
    zs_.avail_out = clamp(out.size());
    const int rc = ::inflate(&zs_, Z_NO_FLUSH);
    in = in.subspan(static_cast<std::size_t>(zs_.next_in - in.data()));
    out = out.subspan(static_cast<std::size_t>(zs_.next_out - out.data()));
    if (rc == Z_STREAM_END) {
      ++members_;
      between_members_ = true;
    } else if (rc == Z_BUF_ERROR) {
      return std::nullopt;  // no progress: it needs more input
    } else if (rc == Z_MEM_ERROR) {
      throw std::bad_alloc();
    } else if (rc != Z_OK) {
      const std::string why = zs_.msg != nullptr ? zs_.msg : "zlib error " + std::to_string(rc);
      if (in_trailing_bytes()) return std::string(kTrailing) + " (" + why + ")";
      return "corrupt gzip stream: " + why;
    }
  }
  return std::nullopt;
}

std::optional<std::string> GzipInflater::finish() const {
  if (between_members_) return std::nullopt;
  if (in_trailing_bytes()) return std::string(kTrailing) + " (unexpected end of file)";
  return "truncated gzip stream (unexpected end of file)";
}

bool is_gzip(std::span<const std::uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

std::optional<std::vector<std::uint8_t>> gunzip(std::span<const std::uint8_t> bytes, std::size_t max_bytes) {
  GzipInflater inflater;
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  std::vector<std::uint8_t> out;
  while (out.size() <= max_bytes) {
    const std::size_t old = out.size();
    out.resize(old + kChunk);
    std::span<std::uint8_t> room(out.data() + old, kChunk);
    if (inflater.inflate(bytes, room)) return std::nullopt;
    out.resize(out.size() - room.size());
    if (!room.empty()) {  // the input is used up
      if (inflater.finish() || out.size() > max_bytes) return std::nullopt;
      return out;
    }
  }
  return std::nullopt;
}

}  // namespace mnist_mt
