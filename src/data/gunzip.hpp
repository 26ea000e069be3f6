#pragma once
// In-memory gzip decompression with a bound on the output, for checking downloads.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace mnist_mt {

// True when the bytes start with the gzip magic.
bool is_gzip(std::span<const std::uint8_t> bytes);
// The decompressed bytes of every gzip member, or nothing when the stream is corrupt,
// truncated, or would exceed `max_bytes`.
std::optional<std::vector<std::uint8_t>> gunzip(std::span<const std::uint8_t> bytes, std::size_t max_bytes);

}  // namespace mnist_mt
