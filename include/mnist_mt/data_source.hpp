#pragma once
// Which data set a run uses and where it is found (README, "Data").
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "mnist_mt/file_io.hpp"  // cache_root()

namespace mnist_mt {

enum class DatasetKind { kMnist, kFashionMnist };

// "MNIST", "Fashion-MNIST".
std::string_view dataset_name(DatasetKind kind);
// "mnist", "fashion-mnist": the --dataset values and the cache folder names.
std::string_view dataset_key(DatasetKind kind);
// torchvision's folder name under its root: "MNIST", "FashionMNIST".
std::string_view torchvision_folder(DatasetKind kind);

// Offline default: Fashion-MNIST from Debian's dataset-fashion-mnist.
inline const std::filesystem::path kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// Everything the search looks at, so that it depends on nothing else.
struct DataQuery {
  DatasetKind wanted = DatasetKind::kMnist;
  std::optional<std::filesystem::path> data_dir;  // --data
  std::optional<std::filesystem::path> env_dir;   // $MNIST_MT_DATA
  std::filesystem::path working_dir = ".";
  std::filesystem::path cache_root;               // cache_root() of the environment
  std::filesystem::path debian_dir = kDefaultDataDir;
  // Whether MNIST, not found, falls back to Debian's Fashion-MNIST (with a notice): not
  // when the user named the data set.
  bool fashion_fallback = true;
};

struct DataChoice {
  std::filesystem::path dir;
  std::string name;    // the data set its labels' checksum identifies, or "IDX files"
  std::string notice;  // one line when the wanted data set was not found, else empty
};

// Where --download puts `kind` by default: cache_root/<dataset_key>.
std::filesystem::path download_dir(const std::filesystem::path& cache_root, DatasetKind kind);

// The first directory holding the four IDX files (raw or .gz), in this order: data_dir
// and its torchvision layout data_dir/<folder>/raw, when given; else env_dir and
// env_dir/<folder>/raw, when given; else working_dir/data/<folder>/raw, the download
// cache, Debian's Fashion-MNIST (for MNIST: with a notice, where fashion_fallback). Throws InputError listing
// where it looked when none does.
DataChoice locate_data(const DataQuery& query);

// The data set in `dir`, told by the checksums of its training and test labels: "MNIST",
// "Fashion-MNIST", both named when the two are of different ones ("MNIST's training
// labels with Fashion-MNIST's test labels"), or "IDX files" when either is of neither.
std::string identify_data(const std::filesystem::path& dir);
// identify_data's name from the data sets its training and test labels are of (empty:
// neither).
std::string data_set_name(const std::string& train_labels, const std::string& test_labels);

}  // namespace mnist_mt
