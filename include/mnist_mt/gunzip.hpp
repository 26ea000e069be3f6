#pragma once
// gzip decompression: streamed (the IDX reader) and in memory with a bound on the output
// (checking downloads). Strict where gzip(1) is lenient: the data must end at the end of
// a member, and bytes after a member must be another whole member, not ignored garbage.
#include <zlib.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace mnist_mt {

// gzip members one after another, inflated as the input arrives.
class GzipInflater {
 public:
  GzipInflater();  // throws std::bad_alloc when zlib cannot allocate its state
  ~GzipInflater();
  GzipInflater(const GzipInflater&) = delete;
  GzipInflater& operator=(const GzipInflater&) = delete;

  // Inflates from the front of `in` into the front of `out`, advancing both past what it
  // used, until `out` is full or `in` is used up. The problem, when the bytes are not
  // gzip ("corrupt gzip stream: ...", or "trailing bytes ..." after a whole member).
  std::optional<std::string> inflate(std::span<const std::uint8_t>& in, std::span<std::uint8_t>& out);
  // The problem when the input ends here: inside a member rather than after one.
  std::optional<std::string> finish() const;

 private:
  // Whether the bytes since the last whole member are not even a gzip header.
  bool in_trailing_bytes() const { return members_ > 0 && header_.done != 1; }

  z_stream zs_{};
  gz_header header_{};  // its `done` tells a bad header from a bad body
  std::uint64_t members_ = 0;  // whole members inflated
  bool between_members_ = false;
};

// True when the bytes start with the gzip magic.
bool is_gzip(std::span<const std::uint8_t> bytes);
// The decompressed bytes of every gzip member, or nothing when the stream is corrupt,
// truncated, followed by bytes that are not a member, or would exceed `max_bytes`.
std::optional<std::vector<std::uint8_t>> gunzip(std::span<const std::uint8_t> bytes, std::size_t max_bytes);

}  // namespace mnist_mt
