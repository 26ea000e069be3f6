#pragma once
// The fuzz targets' input, as the file the readers take: one file per process in the
// temp directory, rewritten for every input.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace mnist_mt::fuzz {

inline const std::filesystem::path& input_path() {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("mnist_mt_fuzz_" + std::to_string(::getpid()));
  return path;
}

inline const std::filesystem::path& write_input(const void* data, std::size_t size) {
  std::ofstream out(input_path(), std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  return input_path();
}

}  // namespace mnist_mt::fuzz
