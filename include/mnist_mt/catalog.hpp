#pragma once
// The published files of MNIST and Fashion-MNIST: names, mirrors and checksums.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mnist_mt/data_source.hpp"

namespace mnist_mt {

struct FileSpec {
  std::string name;          // without .gz, e.g. "train-images-idx3-ubyte"
  std::string gz_md5;        // of the .gz as published
  std::string content_md5;   // of the decompressed IDX file
  std::uint64_t content_bytes = 0;
};

struct DatasetSpec {
  std::string name;                  // "MNIST"
  std::vector<std::string> mirrors;  // base URLs ending in '/', tried in order
  std::array<FileSpec, 4> files;
};

const DatasetSpec& dataset_spec(DatasetKind kind);

// Whether `bytes` (a .gz or a raw IDX file) hold `file`: the .gz checksum, or the
// checksum of the content, so that re-compressed copies of the same data verify.
bool verifies(const FileSpec& file, const std::vector<std::uint8_t>& bytes);

}  // namespace mnist_mt
