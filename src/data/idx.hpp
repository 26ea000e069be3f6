#pragma once
// Strict reader of IDX files (the MNIST format), raw or gzip-compressed.
// Every malformed input throws InputError("<path>: <problem>") before anything is
// allocated from sizes the file declares.
#include <cstdint>
#include <filesystem>
#include <vector>

namespace mnist_mt {

inline constexpr std::uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;

struct IdxImages {
  std::uint32_t count = 0;
  std::uint32_t rows = 0;
  std::uint32_t cols = 0;
  std::vector<std::uint8_t> pixels;  // count * rows * cols, row-major
};

// Images must be 28x28 and count > 0.
IdxImages read_idx_images(const std::filesystem::path& path);
// Labels must be 0..9 and count > 0.
std::vector<std::uint8_t> read_idx_labels(const std::filesystem::path& path);

}  // namespace mnist_mt
