// --download against an HTTP server on 127.0.0.1 (tests/loopback_server.py) serving
// generated IDX files, whose checksums reach the download through the test seam
// (download_internal.hpp): a good mirror, files already present, 404, a truncated
// body, a wrong checksum, a stalled connection, a dripping one past its deadline, a stop
// signal mid-transfer, a refused connection, a re-compressed copy, and a good second
// mirror after a bad first one. Nothing beyond 127.0.0.1.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mnist_mt/catalog.hpp"
#include "fetch/download_internal.hpp"
#include "mnist_mt/file_io.hpp"
#include "fetch/md5.hpp"
#include "loopback.hpp"
#include "mnist_mt/data_source.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"

namespace {

namespace fs = std::filesystem;
using mnist_mt::DatasetSpec;
using mnist_mt::FetchLimits;
using mnist_mt::InputError;

void put_be32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

std::vector<std::uint8_t> idx_file(bool images, std::uint32_t count, unsigned seed) {
  std::vector<std::uint8_t> out;
  put_be32(out, images ? 0x803 : 0x801);
  put_be32(out, count);
  if (images) {
    put_be32(out, 28);
    put_be32(out, 28);
  }
  const std::size_t payload = images ? std::size_t{count} * 784 : count;
  for (std::size_t i = 0; i < payload; ++i) out.push_back(static_cast<std::uint8_t>((i * 7 + seed) % (images ? 256 : 10)));
  return out;
}

void write_gz(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// A fresh directory per test, removed afterwards.
fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("mnist_mt_dl_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

class Download : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    served_ = fresh_dir(test + "_served");
    dir_ = fresh_dir(test + "_got");
    spec_.name = "generated";
    const std::vector<std::pair<std::string, std::vector<std::uint8_t>>> files = {
        {"train-images-idx3-ubyte", idx_file(true, 20, 1)},
        {"train-labels-idx1-ubyte", idx_file(false, 20, 2)},
        {"t10k-images-idx3-ubyte", idx_file(true, 6, 3)},
        {"t10k-labels-idx1-ubyte", idx_file(false, 6, 4)}};
    for (std::size_t i = 0; i < files.size(); ++i) {
      const fs::path gz = served_ / (files[i].first + ".gz");
      write_gz(gz, files[i].second);
      spec_.files[i] = {files[i].first, mnist_mt::md5_hex(mnist_mt::read_file_bytes(gz, 1 << 20)),
                        mnist_mt::md5_hex(files[i].second), files[i].second.size()};
    }
    server_ = std::make_unique<LoopbackServer>(served_);
    base_ = server_->base();
  }

  void TearDown() override {
    server_.reset();
    fs::remove_all(served_);
    fs::remove_all(dir_);
  }

  // Runs the download from these mirrors (prefixes on the loopback server, or URLs).
  void download(const std::vector<std::string>& mirrors, FetchLimits limits = fast_limits(),
                const std::function<int()>& stop_signal = {}) {
    DatasetSpec spec = spec_;
    spec.mirrors.clear();
    for (const auto& m : mirrors) spec.mirrors.push_back(m.rfind("http", 0) == 0 ? m : base_ + m + "/");
    std::ostringstream log;
    mnist_mt::download_files(spec, dir_, limits, &log, false, stop_signal);
    log_ = log.str();
  }

  static FetchLimits fast_limits() {
    FetchLimits limits;
    limits.connect_seconds = 5;
    limits.stall_seconds = 2;
    return limits;
  }

  std::string failure(const std::vector<std::string>& mirrors, FetchLimits limits = fast_limits()) {
    try {
      download(mirrors, limits);
    } catch (const InputError& e) {
      return e.what();
    }
    ADD_FAILURE() << "the download did not fail";
    return {};
  }

  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  DatasetSpec spec_;
  fs::path served_, dir_;
  std::unique_ptr<LoopbackServer> server_;
  std::string base_;
  std::string log_;
};

const std::vector<std::string> kAllFour = {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
                                           "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"};

TEST_F(Download, FetchesVerifiesAndTheLoaderReadsTheFiles) {
  download({"good"});
  EXPECT_EQ(entries(), kAllFour);
  const mnist_mt::Dataset data = mnist_mt::load_dataset(dir_);
  EXPECT_EQ(data.train.size(), 20u);
  EXPECT_EQ(data.test.size(), 6u);
  EXPECT_NE(log_.find("fetched from " + base_ + "good/train-images-idx3-ubyte.gz, verified"), std::string::npos)
      << log_;
}

TEST_F(Download, FilesPresentAndVerifiedAreNotFetchedAgain) {
  download({"good"});
  download({"missing"});  // would fail if anything were fetched
  EXPECT_EQ(entries(), kAllFour);
  EXPECT_NE(log_.find("present, verified"), std::string::npos) << log_;
}

TEST_F(Download, EveryMirrorFailingNamesTheFileAndEachFailureAndLeavesNothing) {
  const std::string what = failure({"missing", "truncate", "corrupt"});
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  EXPECT_NE(what.find((dir_ / "train-images-idx3-ubyte.gz").string() + ": download failed"), std::string::npos)
      << what;
  EXPECT_NE(what.find(base_ + "missing/train-images-idx3-ubyte.gz: HTTP 404"), std::string::npos) << what;
  EXPECT_NE(what.find(base_ + "truncate/train-images-idx3-ubyte.gz: transfer closed"), std::string::npos) << what;
  EXPECT_NE(what.find(base_ + "corrupt/train-images-idx3-ubyte.gz: checksum mismatch"), std::string::npos) << what;
  EXPECT_TRUE(entries().empty());  // no partial, unverified or temp file
}

TEST_F(Download, AGoodSecondMirrorAfterABadFirstOne) {
  for (const char* bad : {"missing", "truncate", "corrupt"}) {
    SCOPED_TRACE(bad);
    fs::remove_all(dir_);
    download({bad, "good"});
    EXPECT_EQ(entries(), kAllFour);
  }
}

TEST_F(Download, AStalledConnectionTimesOutAndTheNextMirrorServes) {
  const auto start = std::chrono::steady_clock::now();
  const std::string what = failure({"stall"});
  EXPECT_NE(what.find(base_ + "stall/train-images-idx3-ubyte.gz: Operation too slow"), std::string::npos) << what;
  download({"stall", "good"});
  EXPECT_EQ(entries(), kAllFour);
  // Five stalls of 2 s each, far below the server's 20 s stall.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(19));
}

TEST_F(Download, ARefusedConnectionIsReportedAndTheNextMirrorServes) {
  const std::string refused = "http://127.0.0.1:" + closed_loopback_port() + "/";
  const std::string what = failure({refused});
  EXPECT_NE(what.find("onnect"), std::string::npos) << what;  // libcurl: "Failed to connect ..."
  download({refused, "good"});
  EXPECT_EQ(entries(), kAllFour);
}

TEST_F(Download, ARecompressedCopyOfTheSameDataVerifiesByItsContent) {
  download({"recompressed"});
  EXPECT_EQ(entries(), kAllFour);
  EXPECT_NE(mnist_mt::md5_hex(mnist_mt::read_file_bytes(dir_ / kAllFour[2], 1 << 20)), spec_.files[0].gz_md5);
  EXPECT_EQ(mnist_mt::load_dataset(dir_).train.size(), 20u);
}

TEST_F(Download, ABodyOverTheSizeCapFails) {
  FetchLimits limits = fast_limits();
  limits.max_bytes = 100;
  try {
    download({"good"}, limits);
    ADD_FAILURE() << "no failure";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("more than 100 bytes"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(entries().empty());
}

// README, "Data": max(60 s, the file's size at 64 KiB/s); 718 s for the training images.
TEST(FetchDeadline, TheLargerOfAMinuteAndTheSizeAtTheMinimumRate) {
  const FetchLimits limits;
  EXPECT_EQ(limits.min_bytes_per_second, 64 * 1024);
  EXPECT_EQ(mnist_mt::deadline_seconds(limits, 10008), 60);
  const std::uint64_t train_images = 60000ull * 784 + 16;
  EXPECT_DOUBLE_EQ(mnist_mt::deadline_seconds(limits, train_images), train_images / 65536.0);
  EXPECT_NEAR(mnist_mt::deadline_seconds(limits, train_images), 718, 1);
}

// 2 bytes a second passes the stall check (1 byte/s) but not the deadline, here 0.5 s.
TEST_F(Download, ADrippingServerFailsOverToTheNextMirrorAtTheDeadline) {
  FetchLimits limits = fast_limits();
  limits.min_deadline_seconds = 0.5;
  limits.min_bytes_per_second = 1e9;  // the floor decides
  const auto start = std::chrono::steady_clock::now();
  const std::string what = failure({"drip"}, limits);
  EXPECT_NE(what.find(base_ + "drip/train-images-idx3-ubyte.gz: not done within its deadline of 0.5 s"),
            std::string::npos)
      << what;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
  EXPECT_TRUE(entries().empty());
  download({"drip", "good"}, limits);
  EXPECT_EQ(entries(), kAllFour);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));  // five deadlines and change
}

// A SIGINT (here the stop request the CLI's signal watch sets) abandons the transfer
// within about a second, long before the drip or its deadline ends it.
TEST_F(Download, AStopSignalAbandonsTheDownloadAtOnceAndLeavesNothing) {
  const auto start = std::chrono::steady_clock::now();
  const auto stop = [&] { return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(300) ? SIGINT : 0; };
  try {
    download({"drip", "good"}, fast_limits(), stop);
    ADD_FAILURE() << "the download was not abandoned";
  } catch (const mnist_mt::Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGINT);
    EXPECT_NE(std::string(e.what()).find((dir_ / "train-images-idx3-ubyte.gz").string() + ": download abandoned (SIGINT)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2000));
  EXPECT_TRUE(entries().empty());  // no partial or temp file
}

// Debian re-compressed Fashion-MNIST: its .gz checksums differ from the published ones,
// its content checksums are the published ones.
TEST(PublishedChecksums, DebiansFashionMnistVerifiesByContentNotByGz) {
  const fs::path dir = mnist_mt::kDefaultDataDir;
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " is not installed (scripts/setup.sh installs it)";
  for (const mnist_mt::FileSpec& file : mnist_mt::dataset_spec(mnist_mt::DatasetKind::kFashionMnist).files) {
    SCOPED_TRACE(file.name);
    const std::vector<std::uint8_t> bytes = mnist_mt::read_file_bytes(dir / (file.name + ".gz"), 64 << 20);
    EXPECT_NE(mnist_mt::md5_hex(bytes), file.gz_md5);
    EXPECT_TRUE(mnist_mt::verifies(file, bytes));
    std::vector<std::uint8_t> changed = bytes;
    changed[changed.size() / 2] ^= 1;
    EXPECT_FALSE(mnist_mt::verifies(file, changed));
  }
}

}  // namespace
