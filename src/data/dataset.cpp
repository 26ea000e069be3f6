#include "mnist_mt/dataset.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "mnist_mt/error.hpp"
#include "idx.hpp"

namespace mnist_mt {
namespace {

namespace fs = std::filesystem;

// Only a missing entry counts as absent; any other failure is reported by the reader.
bool absent(const fs::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) != 0 && (errno == ENOENT || errno == ENOTDIR);
}

// `name` itself when present (raw or not: the reader goes by content), else `name`.gz.
// Preferring the plain name makes a directory left by `gunzip -k` load the unpacked files.
fs::path find_file(const fs::path& dir, const std::string& name) {
  const fs::path plain = dir / name;
  if (!absent(plain)) return plain;
  fs::path gz = dir / (name + ".gz");
  if (!absent(gz)) return gz;
  throw InputError(plain.string() + ": not found (nor " + gz.filename().string() + ")");
}

Split load_split(const fs::path& dir, const std::string& prefix) {
  const fs::path images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const fs::path labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  IdxImages images = read_idx_images(images_path);
  std::vector<std::uint8_t> labels = read_idx_labels(labels_path);
  if (images.count != labels.size())
    throw InputError(images_path.string() + ": " + std::to_string(images.count) + " images, but " +
                     labels_path.string() + " has " + std::to_string(labels.size()) + " labels");
  Split split;
  split.images = std::move(images.pixels);
  split.labels = std::move(labels);
  return split;
}

}  // namespace

Dataset load_dataset(const fs::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    throw InputError(dir.string() + ": cannot open data directory: " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw InputError(dir.string() + ": cannot open data directory: " + std::strerror(ENOTDIR));
  Dataset data;
  data.train = load_split(dir, "train");
  data.test = load_split(dir, "t10k");
  return data;
}

}  // namespace mnist_mt
