#pragma once
// The download with its data set description and limits as parameters: the seam the
// loopback tests use to serve generated files with their own checksums.
#include <cstdint>
#include <filesystem>
#include <ostream>

#include "catalog.hpp"

namespace mnist_mt {

struct FetchLimits {
  long connect_seconds = 30;
  long stall_seconds = 60;  // a transfer slower than 1 byte/s this long fails
  std::uint64_t max_bytes = std::uint64_t{64} << 20;
};

void download_files(const DatasetSpec& spec, const std::filesystem::path& dir, const FetchLimits& limits,
                    std::ostream* log, bool show_progress);

}  // namespace mnist_mt
