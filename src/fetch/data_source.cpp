#include "mnist_mt/data_source.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "mnist_mt/catalog.hpp"
#include "mnist_mt/file_io.hpp"
#include "mnist_mt/gunzip.hpp"
#include "md5.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

namespace fs = std::filesystem;

bool present(const fs::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// All four files, each raw or .gz: what load_dataset() reads.
bool holds_idx_files(const fs::path& dir) {
  for (const FileSpec& file : dataset_spec(DatasetKind::kMnist).files) {
    if (!present(dir / file.name) && !present(dir / (file.name + ".gz"))) return false;
  }
  return true;
}

// The places the search looks, in order, for the data set `kind`. A directory the user
// named (--data, $MNIST_MT_DATA) is the only place looked at, so a mistyped one is
// reported instead of passed over.
std::vector<fs::path> candidates(const DataQuery& q, DatasetKind kind) {
  const std::string folder(torchvision_folder(kind));
  if (q.data_dir) return {*q.data_dir, *q.data_dir / folder / "raw"};
  if (q.env_dir) return {*q.env_dir, *q.env_dir / folder / "raw"};
  std::vector<fs::path> dirs{q.working_dir / "data" / folder / "raw"};
  if (!q.cache_root.empty()) dirs.push_back(download_dir(q.cache_root, kind));
  if (kind == DatasetKind::kFashionMnist) dirs.push_back(q.debian_dir);
  return dirs;
}

}  // namespace

std::string_view dataset_name(DatasetKind kind) { return kind == DatasetKind::kMnist ? "MNIST" : "Fashion-MNIST"; }
std::string_view dataset_key(DatasetKind kind) { return kind == DatasetKind::kMnist ? "mnist" : "fashion-mnist"; }
std::string_view torchvision_folder(DatasetKind kind) {
  return kind == DatasetKind::kMnist ? "MNIST" : "FashionMNIST";
}

fs::path download_dir(const fs::path& cache_root, DatasetKind kind) { return cache_root / dataset_key(kind); }

DataChoice locate_data(const DataQuery& query) {
  // A directory the user named, by its name: --data or $MNIST_MT_DATA.
  const std::string source = query.data_dir ? "--data: " : query.env_dir ? "MNIST_MT_DATA: " : "";
  if (const auto& named_dir = query.data_dir ? query.data_dir : query.env_dir) {
    if (named_dir->empty()) throw InputError(source + "an empty path");
    std::error_code error;
    if (fs::exists(*named_dir, error) && !fs::is_directory(*named_dir, error))
      throw InputError(source + named_dir->string() + " is not a directory");
  }
  std::string looked;
  for (const fs::path& dir : candidates(query, query.wanted)) {
    if (holds_idx_files(dir)) return {dir, identify_data(dir), ""};
    looked += (looked.empty() ? "" : ", ") + dir.string();
  }
  const bool named = query.data_dir || query.env_dir;
  if (!named && query.fashion_fallback && query.wanted == DatasetKind::kMnist && holds_idx_files(query.debian_dir)) {
    return {query.debian_dir, identify_data(query.debian_dir),
            "no MNIST found (looked in " + looked + "); using Fashion-MNIST from " + query.debian_dir.string() +
                " (--download fetches MNIST)"};
  }
  const std::string what = named ? "no IDX files (train-images-idx3-ubyte[.gz] and the other three)"
                                 : "no " + std::string(dataset_name(query.wanted)) + " data";
  // A named directory in torchvision's layout of the other data set: say which flag finds it.
  if (named) {
    const DatasetKind other =
        query.wanted == DatasetKind::kMnist ? DatasetKind::kFashionMnist : DatasetKind::kMnist;
    const fs::path theirs = *(query.data_dir ? query.data_dir : query.env_dir) / torchvision_folder(other) / "raw";
    if (holds_idx_files(theirs))
      throw InputError(source + what + " in " + looked + "; " + theirs.string() + " holds them: add --dataset " +
                       std::string(dataset_key(other)));
  }
  throw InputError(source + what + " in " + looked + "; --download fetches " + std::string(dataset_name(query.wanted)));
}

namespace {

// The data set whose labels file `index` (1: training, 3: test) is in `dir`, or empty.
std::string labels_of(const fs::path& dir, std::size_t index) {
  const FileSpec& labels = dataset_spec(DatasetKind::kMnist).files[index];
  for (const fs::path& path : {dir / labels.name, dir / (labels.name + ".gz")}) {
    if (!present(path)) continue;
    try {
      std::vector<std::uint8_t> bytes = read_file_bytes(path, labels.content_bytes * 4 + 4096);
      if (is_gzip(bytes)) bytes = gunzip(bytes, labels.content_bytes).value_or(std::vector<std::uint8_t>{});
      const std::string md5 = md5_hex(bytes);
      for (DatasetKind kind : {DatasetKind::kMnist, DatasetKind::kFashionMnist}) {
        if (md5 == dataset_spec(kind).files[index].content_md5) return dataset_spec(kind).name;
      }
    } catch (const InputError&) {  // unreadable here: the loader reports it
    }
    break;
  }
  return "";
}

}  // namespace

std::string data_set_name(const std::string& train_labels, const std::string& test_labels) {
  if (train_labels.empty() || test_labels.empty()) return "IDX files";
  return train_labels == test_labels ? train_labels
                                     : train_labels + "'s training labels with " + test_labels + "'s test labels";
}

std::string identify_data(const fs::path& dir) { return data_set_name(labels_of(dir, 1), labels_of(dir, 3)); }

}  // namespace mnist_mt
