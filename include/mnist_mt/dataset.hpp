#pragma once
// MNIST-format data set in memory: loaded once, shared read-only by every rank.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "mnist_mt/batch.hpp"  // Samples
#include "mnist_mt/model.hpp"  // kImageBytes

namespace mnist_mt {

struct Split {
  std::vector<std::uint8_t> images;  // size() * kImageBytes
  std::vector<std::uint8_t> labels;  // size()
  std::uint32_t size() const { return static_cast<std::uint32_t>(labels.size()); }
  const std::uint8_t* image(std::uint32_t i) const { return images.data() + std::size_t{i} * kImageBytes; }
  Samples samples() const { return {images, labels}; }
};

struct Dataset {
  Split train;
  Split test;
};

// Loads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
// t10k-labels-idx1-ubyte from `dir`, each raw or with .gz. Throws InputError naming the
// file and the problem (missing file, count mismatch, any IDX error).
Dataset load_dataset(const std::filesystem::path& dir);

}  // namespace mnist_mt
