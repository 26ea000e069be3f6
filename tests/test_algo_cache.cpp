// The cuDNN algorithm cache's file (src/cuda/algo_cache.cpp), which needs no GPU: choices
// found again by a later process, merged with another process's, a bad file ignored and
// replaced, a path it may not write leaving the choice in memory with one warning, the
// file's place from the environment.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "cuda/algo_cache.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cuda {
namespace {

namespace fs = std::filesystem;

class AlgoCacheFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mnist_mt_algo_cache_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

const ConvChoice kA{1, 1, 3, 2, 5, 1};
const ConvChoice kB{0, 0, 1, 1, -1, 0};

TEST_F(AlgoCacheFile, ALaterProcessFindsTheChoicesAndAnotherProcessesAreKept) {
  const fs::path file = dir_ / "sub" / "cudnn-algorithms.txt";  // the directory is made
  AlgoCache first(file), second(file);
  EXPECT_FALSE(first.find("gpu|n64"));
  EXPECT_FALSE(second.find("gpu|n4"));  // read before first writes
  first.store("gpu|n64", kA);
  second.store("gpu|n4", kB);  // merges what first wrote
  AlgoCache later(file);
  EXPECT_EQ(later.find("gpu|n64"), kA);
  EXPECT_EQ(later.find("gpu|n4"), kB);
  EXPECT_FALSE(later.find("gpu|n8"));
  later.store("gpu|n64", kB);  // replaced
  EXPECT_EQ(AlgoCache(file).find("gpu|n64"), kB);
}

TEST_F(AlgoCacheFile, AMalformedFileIsIgnoredWithOneWarningAndReplaced) {
  fs::create_directories(dir_);
  const fs::path file = dir_ / "c.txt";
  for (const char* text : {"not ours\n", "# mnist_mt cuDNN algorithm choices, format 1\nkey\t1 2 3\n",
                           "# mnist_mt cuDNN algorithm choices, format 1\nkey\t1 2 3 4 5 6 7\n",
                           "# mnist_mt cuDNN algorithm choices, format 1\n\t1 2 3 4 5 6\n"}) {
    SCOPED_TRACE(text);
    std::ofstream(file) << text;
    AlgoCache cache(file);
    ::testing::internal::CaptureStderr();
    EXPECT_FALSE(cache.find("key"));
    EXPECT_FALSE(cache.find("other"));
    const std::string warned = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(warned.find(file.string()), std::string::npos) << warned;
    EXPECT_EQ(warned.find('\n'), warned.size() - 1) << "one line: " << warned;
    cache.store("key", kA);
    EXPECT_EQ(AlgoCache(file).find("key"), kA);
  }
}

// Another version's file is read as none and never replaced.
TEST_F(AlgoCacheFile, AnotherVersionsFileIsLeftAlone) {
  fs::create_directories(dir_);
  const fs::path file = dir_ / "c.txt";
  const std::string text = "# mnist_mt cuDNN algorithm choices, format 2\nsomething else\n";
  std::ofstream(file) << text;
  AlgoCache cache(file);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.find("key"));
  cache.store("key", kA);
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warned.find("another version"), std::string::npos) << warned;
  EXPECT_EQ(cache.find("key"), kA);
  std::ifstream in(file);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), text);
}

TEST_F(AlgoCacheFile, APlaceItMayNotWriteKeepsTheChoiceInMemoryWithOneWarning) {
  fs::create_directories(dir_ / "a_directory");
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(dir_ / "a_file") << "x";
  // A directory and a FIFO where the file should be (read and write refused), and a file
  // where its directory should be (nothing to read; the write fails).
  for (const fs::path& file : {dir_ / "a_directory", fifo, dir_ / "a_file" / "c.txt"}) {
    SCOPED_TRACE(file.string());
    AlgoCache cache(file);
    ::testing::internal::CaptureStderr();
    EXPECT_FALSE(cache.find("key"));
    cache.store("key", kA);
    cache.store("key2", kB);
    const std::string warned = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(warned.find("warning"), std::string::npos) << warned;
    EXPECT_EQ(warned.find('\n'), warned.size() - 1) << "one line: " << warned;
    EXPECT_EQ(cache.find("key"), kA);
    EXPECT_EQ(cache.find("key2"), kB);
  }
  EXPECT_TRUE(fs::is_fifo(fifo)) << "a FIFO is never replaced";
  EXPECT_TRUE(fs::is_directory(dir_ / "a_directory"));
}

TEST_F(AlgoCacheFile, NoFileKeepsChoicesForTheProcessOnly) {
  AlgoCache cache{fs::path()};
  cache.store("key", kA);
  EXPECT_EQ(cache.find("key"), kA);
  EXPECT_THROW(cache.store("a\tkey", kA), RuntimeFailure);
  EXPECT_THROW(cache.store("", kA), RuntimeFailure);
}

TEST_F(AlgoCacheFile, ThePlaceComesFromTheEnvironment) {
  const auto saved = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  const auto cache_dir = saved("MNIST_MT_CACHE_DIR"), xdg = saved("XDG_CACHE_HOME"), home = saved("HOME");
  ::setenv("MNIST_MT_CACHE_DIR", "/c", 1);
  ::setenv("XDG_CACHE_HOME", "/x", 1);
  ::setenv("HOME", "/h", 1);
  EXPECT_EQ(AlgoCache::default_file(), fs::path("/c/cudnn-algorithms.txt"));
  ::setenv("MNIST_MT_CACHE_DIR", "", 1);  // set and empty: no file
  EXPECT_EQ(AlgoCache::default_file(), fs::path());
  ::unsetenv("MNIST_MT_CACHE_DIR");
  EXPECT_EQ(AlgoCache::default_file(), fs::path("/x/mnist_mt/cudnn-algorithms.txt"));
  ::setenv("XDG_CACHE_HOME", "", 1);
  EXPECT_EQ(AlgoCache::default_file(), fs::path("/h/.cache/mnist_mt/cudnn-algorithms.txt"));
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  EXPECT_EQ(AlgoCache::default_file(), fs::path());
  const auto restore = [](const char* name, const std::optional<std::string>& v) {
    if (v) ::setenv(name, v->c_str(), 1);
    else ::unsetenv(name);
  };
  restore("MNIST_MT_CACHE_DIR", cache_dir);
  restore("XDG_CACHE_HOME", xdg);
  restore("HOME", home);
}

}  // namespace
}  // namespace mnist_mt::cuda
