#pragma once
// The download with its data set description and limits as parameters: the seam the
// loopback tests use to serve generated files with their own checksums.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <ostream>

#include "mnist_mt/catalog.hpp"

namespace mnist_mt {

struct FetchLimits {
  long connect_seconds = 30;
  long stall_seconds = 60;  // a transfer slower than 1 byte/s this long fails
  // Each transfer of a file must end within deadline_seconds(): a server that drips
  // bytes just fast enough to pass the stall check fails over to the next mirror too.
  double min_deadline_seconds = 60;
  double min_bytes_per_second = 64 * 1024;
  std::uint64_t max_bytes = std::uint64_t{64} << 20;
};

// The time one transfer of a file of `bytes` (decompressed: its .gz is smaller) may
// take: max(min_deadline_seconds, bytes / min_bytes_per_second).
double deadline_seconds(const FetchLimits& limits, std::uint64_t bytes);

// `stop_signal`, when given, is polled during transfers: a nonzero value (the signal)
// abandons the download with Interrupted, leaving no partial file.
void download_files(const DatasetSpec& spec, const std::filesystem::path& dir, const FetchLimits& limits,
                    std::ostream* log, bool show_progress, const std::function<int()>& stop_signal = {});

}  // namespace mnist_mt
