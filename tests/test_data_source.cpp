// Where the data is found: --data (and its torchvision layout), $MNIST_MT_DATA,
// ./data/MNIST/raw, the download cache, then Debian's Fashion-MNIST with a notice;
// and which data set a directory holds, by its labels' checksum.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "mnist_mt/data_source.hpp"
#include "mnist_mt/error.hpp"

namespace {

namespace fs = std::filesystem;
using mnist_mt::DataQuery;
using mnist_mt::DatasetKind;

class DataSource : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("mnist_mt_ds_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    query_.working_dir = root_ / "cwd";
    query_.cache_root = root_ / "cache";
    query_.debian_dir = root_ / "debian";
    fill(query_.debian_dir);
  }
  void TearDown() override { fs::remove_all(root_); }

  // The four names, raw or .gz: the search looks for files, the loader reads them.
  static void fill(const fs::path& dir, bool gz = false) {
    fs::create_directories(dir);
    for (const char* name :
         {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
      std::ofstream(dir / (std::string(name) + (gz ? ".gz" : ""))) << "x";
    }
  }

  fs::path root_;
  DataQuery query_;
};

TEST_F(DataSource, EachPlaceInOrderTakesPrecedenceOverTheNext) {
  // Nothing but Debian's: MNIST falls back to it with a one-line notice.
  auto choice = mnist_mt::locate_data(query_);
  EXPECT_EQ(choice.dir, query_.debian_dir);
  EXPECT_NE(choice.notice.find("no MNIST found"), std::string::npos) << choice.notice;
  EXPECT_EQ(choice.notice.find('\n'), std::string::npos);

  fill(query_.cache_root / "mnist", true);
  EXPECT_EQ(mnist_mt::locate_data(query_).dir, query_.cache_root / "mnist");
  EXPECT_TRUE(mnist_mt::locate_data(query_).notice.empty());

  fill(query_.working_dir / "data" / "MNIST" / "raw");
  EXPECT_EQ(mnist_mt::locate_data(query_).dir, query_.working_dir / "data" / "MNIST" / "raw");

  query_.env_dir = root_ / "env";
  fill(*query_.env_dir);
  EXPECT_EQ(mnist_mt::locate_data(query_).dir, *query_.env_dir);

  query_.data_dir = root_ / "flag";
  fill(*query_.data_dir / "MNIST" / "raw");
  EXPECT_EQ(mnist_mt::locate_data(query_).dir, *query_.data_dir / "MNIST" / "raw");
  fill(*query_.data_dir);
  EXPECT_EQ(mnist_mt::locate_data(query_).dir, *query_.data_dir);
}

TEST_F(DataSource, FashionMnistHasItsOwnCacheAndTorchvisionFolder) {
  query_.wanted = DatasetKind::kFashionMnist;
  fill(query_.cache_root / "mnist");  // MNIST's cache is not Fashion-MNIST
  auto choice = mnist_mt::locate_data(query_);
  EXPECT_EQ(choice.dir, query_.debian_dir);
  EXPECT_TRUE(choice.notice.empty());
  fill(query_.working_dir / "data" / "FashionMNIST" / "raw");
  EXPECT_EQ(mnist_mt::locate_data(query_).dir, query_.working_dir / "data" / "FashionMNIST" / "raw");
}

TEST_F(DataSource, ANamedDirectoryWithoutTheFilesIsAnErrorNamingIt) {
  query_.data_dir = root_ / "empty";
  fs::create_directories(*query_.data_dir);
  try {
    mnist_mt::locate_data(query_);
    FAIL() << "no error";
  } catch (const mnist_mt::InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(query_.data_dir->string()), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos);
  }
  query_.data_dir.reset();
  query_.env_dir = root_ / "empty";
  EXPECT_THROW(mnist_mt::locate_data(query_), mnist_mt::InputError);
  // torchvision's layout of the other data set there: the error says which flag finds it.
  fill(*query_.env_dir / "FashionMNIST" / "raw");
  try {
    mnist_mt::locate_data(query_);
    FAIL() << "no error";
  } catch (const mnist_mt::InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((*query_.env_dir / "FashionMNIST" / "raw").string() + " holds them: add --dataset fashion-mnist"),
              std::string::npos)
        << what;
  }
}

TEST_F(DataSource, NoDataAnywhereNamesEveryPlaceLooked) {
  fs::remove_all(query_.debian_dir);
  try {
    mnist_mt::locate_data(query_);
    FAIL() << "no error";
  } catch (const mnist_mt::InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((query_.working_dir / "data" / "MNIST" / "raw").string()), std::string::npos) << what;
    EXPECT_NE(what.find((query_.cache_root / "mnist").string()), std::string::npos) << what;
    EXPECT_NE(what.find("--download"), std::string::npos) << what;
  }
}

// --dataset mnist given: MNIST or nothing, no Fashion-MNIST fallback.
TEST_F(DataSource, MnistAskedForByNameDoesNotFallBackToFashionMnist) {
  query_.fashion_fallback = false;
  try {
    mnist_mt::locate_data(query_);
    FAIL() << "no error";
  } catch (const mnist_mt::InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no MNIST data in "), std::string::npos) << what;
    EXPECT_EQ(what.find(query_.debian_dir.string()), std::string::npos) << what;
  }
}

TEST_F(DataSource, TheCacheFollowsXdgThenHome) {
  setenv("XDG_CACHE_HOME", "/x/cache", 1);
  EXPECT_EQ(mnist_mt::cache_root(), fs::path("/x/cache/mnist_mt"));
  setenv("XDG_CACHE_HOME", "", 1);
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(mnist_mt::cache_root(), fs::path("/home/u/.cache/mnist_mt"));
  EXPECT_EQ(mnist_mt::download_dir("/c", DatasetKind::kFashionMnist), fs::path("/c/fashion-mnist"));
}

TEST(Identify, TellsDebiansFashionMnistFromOtherIdxFiles) {
  if (!fs::exists(mnist_mt::kDefaultDataDir)) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  EXPECT_EQ(mnist_mt::identify_data(mnist_mt::kDefaultDataDir), "Fashion-MNIST");
  const fs::path other = fs::temp_directory_path() / ("mnist_mt_id_" + std::to_string(::getpid()));
  fs::create_directories(other);
  std::ofstream(other / "train-labels-idx1-ubyte") << "not labels";
  EXPECT_EQ(mnist_mt::identify_data(other), "IDX files");
  // Fashion-MNIST's training labels with test labels of neither data set: not Fashion-MNIST.
  fs::remove(other / "train-labels-idx1-ubyte");
  for (const char* name : {"train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "train-labels-idx1-ubyte",
                           "t10k-labels-idx1-ubyte"})
    if (fs::exists(mnist_mt::kDefaultDataDir / name)) fs::copy_file(mnist_mt::kDefaultDataDir / name, other / name);
  EXPECT_EQ(mnist_mt::identify_data(other), "Fashion-MNIST");
  for (const char* name : {"t10k-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte"}) fs::remove(other / name);
  std::ofstream(other / "t10k-labels-idx1-ubyte") << "not labels";
  EXPECT_EQ(mnist_mt::identify_data(other), "IDX files");
  fs::remove_all(other);
}

// A directory's name from its two label files: one data set, both when they differ, IDX
// files when either is of neither.
TEST(Identify, NamesBothDataSetsOfAMixedDirectory) {
  EXPECT_EQ(mnist_mt::data_set_name("MNIST", "MNIST"), "MNIST");
  EXPECT_EQ(mnist_mt::data_set_name("MNIST", "Fashion-MNIST"), "MNIST's training labels with Fashion-MNIST's test labels");
  EXPECT_EQ(mnist_mt::data_set_name("Fashion-MNIST", ""), "IDX files");
  EXPECT_EQ(mnist_mt::data_set_name("", "MNIST"), "IDX files");
}

}  // namespace
