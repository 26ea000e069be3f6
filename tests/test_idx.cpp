// The IDX reader and the data set loader: every bad input is one InputError line
// naming the file and the problem, nothing large is allocated from declared sizes, and
// no corruption crashes the reader.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "mnist_mt/data_source.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"
#include "data/idx.hpp"

#include "alloc_hook.hpp"

namespace mnist_mt {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "mnist_mt_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void put32(Bytes& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

Bytes images_file(std::uint32_t count, std::uint32_t rows = 28, std::uint32_t cols = 28, std::uint8_t salt = 0) {
  Bytes out;
  put32(out, kIdxImagesMagic);
  put32(out, count);
  put32(out, rows);
  put32(out, cols);
  for (std::size_t i = 0; i < std::size_t{count} * rows * cols; ++i)
    out.push_back(static_cast<std::uint8_t>(i * 7 + salt));
  return out;
}

Bytes labels_file(const Bytes& labels) {
  Bytes out;
  put32(out, kIdxLabelsMagic);
  put32(out, static_cast<std::uint32_t>(labels.size()));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

Bytes labels_file(std::uint32_t count) {
  Bytes labels(count);
  for (std::uint32_t i = 0; i < count; ++i) labels[i] = static_cast<std::uint8_t>(i % 10);
  return labels_file(labels);
}

Bytes gzip(const Bytes& data) {
  z_stream z{};
  if (deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw std::runtime_error("deflateInit2 failed");
  Bytes out(deflateBound(&z, data.size()) + 64);
  z.next_in = const_cast<std::uint8_t*>(data.data());
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw std::runtime_error("deflate failed");
  return out;
}

fs::path write(const fs::path& path, const Bytes& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (!f) throw std::runtime_error("cannot write " + path.string());
  return path;
}

// Runs `read` and requires one InputError line "<path>: ...<problem>...".
void expect_error(const fs::path& path, const std::function<void()>& read, const std::string& problem) {
  try {
    read();
    ADD_FAILURE() << path << ": accepted, expected an error containing '" << problem << "'";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path.string() + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

void expect_images_error(const fs::path& path, const std::string& problem) {
  expect_error(path, [&] { read_idx_images(path); }, problem);
}

void expect_labels_error(const fs::path& path, const std::string& problem) {
  expect_error(path, [&] { read_idx_labels(path); }, problem);
}

// Each case runs on the raw bytes and on their gzip.
class IdxBoth : public ::testing::TestWithParam<bool> {
 protected:
  bool gz() const { return GetParam(); }
  fs::path file(const std::string& name, const Bytes& content) const {
    return write(dir_ / (gz() ? name + ".gz" : name), gz() ? gzip(content) : content);
  }
  TempDir dir_;
};

INSTANTIATE_TEST_SUITE_P(RawAndGzip, IdxBoth, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "gzip" : "raw"; });

TEST_P(IdxBoth, ReadsValidImagesAndLabels) {
  const Bytes content = images_file(3);
  const IdxImages images = read_idx_images(file("images", content));
  EXPECT_EQ(images.count, 3u);
  EXPECT_EQ(images.rows, 28u);
  EXPECT_EQ(images.cols, 28u);
  EXPECT_EQ(images.pixels, Bytes(content.begin() + 16, content.end()));

  const Bytes labels = {0, 9, 3, 7, 1};
  EXPECT_EQ(read_idx_labels(file("labels", labels_file(labels))), labels);
}

TEST_P(IdxBoth, WrongMagic) {
  expect_images_error(file("labels-as-images", labels_file(5)), "wrong magic 0x00000801, expected 0x00000803");
  expect_labels_error(file("images-as-labels", images_file(1)), "wrong magic 0x00000803, expected 0x00000801");
  Bytes random(4096);
  std::mt19937 gen(7);
  for (auto& b : random) b = static_cast<std::uint8_t>(gen());
  random[0] = 0x42;  // not gzip's first byte, nor IDX's
  expect_images_error(file("random", random), "wrong magic");
  expect_labels_error(file("random", random), "wrong magic");
}

TEST_P(IdxBoth, TruncatedHeader) {
  const Bytes images = images_file(1);
  expect_images_error(file("short", Bytes(images.begin(), images.begin() + 10)),
                      "truncated header: expected 16 bytes, got 10");
  const Bytes labels = labels_file(3);
  expect_labels_error(file("short", Bytes(labels.begin(), labels.begin() + 6)),
                      "truncated header: expected 8 bytes, got 6");
  expect_labels_error(file("empty", {}), "truncated header: expected 8 bytes, got 0");
}

TEST_P(IdxBoth, TruncatedPayload) {
  Bytes images = images_file(2);
  images.resize(images.size() - 100);
  expect_images_error(file("images", images), gz() ? "truncated payload: expected 1584 bytes, got 1484"
                                                   : "truncated payload: header declares 1584 bytes, file has 1484");
  Bytes labels = labels_file(10);
  labels.pop_back();
  expect_labels_error(file("labels", labels), gz() ? "truncated payload: expected 18 bytes, got 17"
                                                   : "truncated payload: header declares 18 bytes, file has 17");
}

TEST_P(IdxBoth, TrailingBytes) {
  Bytes images = images_file(2);
  images.insert(images.end(), {1, 2, 3});
  expect_images_error(file("images", images), gz() ? "trailing bytes: 3 after the 1584 bytes"
                                                    : "trailing bytes: header declares 1584 bytes, file has 1587");
  Bytes labels = labels_file(4);
  labels.push_back(0);
  expect_labels_error(file("labels", labels), "trailing bytes");
}

TEST_P(IdxBoth, ZeroCount) {
  expect_images_error(file("images", images_file(0)), "zero count");
  expect_labels_error(file("labels", labels_file(Bytes{})), "zero count");
}

TEST_P(IdxBoth, ImagesMustBe28x28) {
  expect_images_error(file("images", images_file(2, 28, 27)), "images are 28x27, expected 28x28");
  expect_images_error(file("images", images_file(1, 32, 32)), "images are 32x32, expected 28x28");
}

TEST_P(IdxBoth, LabelOutOfRangeGivesIndexAndValue) {
  expect_labels_error(file("labels", labels_file(Bytes{1, 2, 9, 12, 0})), "label 12 at index 3 is out of range 0..9");
  expect_labels_error(file("labels", labels_file(Bytes{255})), "label 255 at index 0");
}

TEST_P(IdxBoth, DeclaredSizeOverflow) {
  Bytes header;
  put32(header, kIdxImagesMagic);
  for (int i = 0; i < 3; ++i) put32(header, 0xffffffffu);
  header.resize(header.size() + 64);
  expect_images_error(file("images", header), "declared size 4294967295x4294967295x4294967295 overflows 64 bits");
}

TEST_P(IdxBoth, DeclaredSizeBeyondTheFileAllocatesNothing) {
  Bytes images = images_file(1);
  images[4] = images[5] = images[6] = images[7] = 0xff;  // 2^32-1 images of 28x28: 3.4 TB
  const fs::path path = file("images", images);
  alloc_hook::largest = 0;
  expect_images_error(path, "truncated payload: header declares 3367254359296 bytes");
  EXPECT_LT(alloc_hook::largest.load(), std::size_t{1} << 20);

  Bytes labels = labels_file(3);
  labels[4] = labels[5] = labels[6] = labels[7] = 0xff;
  const fs::path labels_path = file("labels", labels);
  alloc_hook::largest = 0;
  expect_labels_error(labels_path, "truncated payload");
  EXPECT_LT(alloc_hook::largest.load(), std::size_t{1} << 20);
}

TEST(IdxGzip, ShortDataUnderAPlausibleDeclaredSizeGrowsWithTheData) {
  // 100000 images declared (78 MB), which 128 kB of incompressible gzip could in principle
  // hold, but only 128 kB of pixels follow: memory must follow the data read.
  TempDir dir;
  Bytes content;
  put32(content, kIdxImagesMagic);
  put32(content, 100000);
  put32(content, 28);
  put32(content, 28);
  std::mt19937 gen(3);
  for (int i = 0; i < 128 * 1024; ++i) content.push_back(static_cast<std::uint8_t>(gen()));
  const fs::path path = write(dir / "images", gzip(content));
  alloc_hook::largest = 0;
  expect_images_error(path, "truncated payload: expected 78400016 bytes, got 131088 (decompressed)");
  EXPECT_LT(alloc_hook::largest.load(), std::size_t{4} << 20);
}

TEST(IdxGzip, ContentDecidesNotTheName) {
  TempDir dir;
  const Bytes content = images_file(2);
  EXPECT_EQ(read_idx_images(write(dir / "gzip-named-raw", gzip(content))).count, 2u);
  EXPECT_EQ(read_idx_images(write(dir / "raw-named.gz", content)).count, 2u);
}

TEST(IdxGzip, CorruptStream) {
  TempDir dir;
  Bytes gz = gzip(images_file(4));
  for (std::size_t i = 12; i < 40; ++i) gz[i] ^= 0x5a;
  expect_images_error(write(dir / "corrupt.gz", gz), "corrupt gzip stream");
}

TEST(IdxGzip, BadChecksum) {
  TempDir dir;
  Bytes gz = gzip(labels_file(50));
  gz[gz.size() - 8] ^= 0xff;  // CRC-32 in the trailer: the payload itself decodes fine
  expect_labels_error(write(dir / "crc.gz", gz), "corrupt gzip stream: incorrect data check");
}

TEST(IdxGzip, TruncatedStream) {
  TempDir dir;
  const Bytes gz = gzip(images_file(4));
  expect_images_error(write(dir / "cut.gz", Bytes(gz.begin(), gz.begin() + gz.size() / 2)),
                      "truncated gzip stream");
  // Only the trailer is missing: every payload byte decodes, zlib reports it at the end.
  expect_images_error(write(dir / "no-trailer.gz", Bytes(gz.begin(), gz.end() - 8)), "truncated gzip stream");
  expect_images_error(write(dir / "magic-only.gz", Bytes{0x1f, 0x8b}), "truncated gzip stream");
}

TEST(IdxGzip, CompressedTwice) {
  TempDir dir;
  expect_images_error(write(dir / "twice.gz", gzip(gzip(images_file(1)))), "gzip-compressed twice?");
}

// gzip(1) and zlib's gzread ignore what follows the last member; a file with anything
// but another whole member there is refused, whatever the IDX data says.
TEST(IdxGzip, BytesAfterTheLastMemberMustBeAnotherMember) {
  TempDir dir;
  const Bytes gz = gzip(images_file(2));
  const std::vector<std::pair<Bytes, std::string>> tails = {
      {{'j', 'u', 'n', 'k'}, "trailing bytes after the gzip stream that are not a gzip member (incorrect header check)"},
      {Bytes(512, 0), "trailing bytes after the gzip stream that are not a gzip member"},
      {{0x1f, 0x8b}, "trailing bytes after the gzip stream that are not a gzip member (unexpected end of file)"},
      {{0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff}, "corrupt gzip stream"},  // a header, then garbage
  };
  for (std::size_t i = 0; i < tails.size(); ++i) {
    Bytes bytes = gz;
    bytes.insert(bytes.end(), tails[i].first.begin(), tails[i].first.end());
    expect_images_error(write(dir / ("tail" + std::to_string(i) + ".gz"), bytes), tails[i].second);
  }
  // Whole members are the concatenation of their contents, as gzip(1) makes them.
  const Bytes content = images_file(3);
  const std::size_t half = content.size() / 2;
  Bytes two = gzip(Bytes(content.begin(), content.begin() + half));
  const Bytes second = gzip(Bytes(content.begin() + half, content.end()));
  two.insert(two.end(), second.begin(), second.end());
  EXPECT_EQ(read_idx_images(write(dir / "two.gz", two)).pixels, Bytes(content.begin() + 16, content.end()));
}

// Opening a FIFO (or a device) for reading waits for a writer: the reader must see that
// it is not a regular file without opening it that way. A child process, so that a
// reader that blocks is killed by the alarm instead of hanging the test.
TEST(IdxFile, AFifoIsRefusedWithoutBlocking) {
  TempDir dir;
  for (const char* name : {"fifo", "fifo.gz"}) {
    const fs::path path = dir / name;
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
    EXPECT_EXIT(
        {
          ::alarm(5);
          try {
            read_idx_labels(path);
          } catch (const InputError& e) {
            std::_Exit(std::string(e.what()) == path.string() + ": cannot read: not a regular file" ? 0 : 1);
          }
          std::_Exit(3);
        },
        ::testing::ExitedWithCode(0), "");
  }
}

TEST(IdxFile, MissingFile) {
  TempDir dir;
  expect_images_error(dir / "absent", "cannot open: No such file or directory");
  expect_labels_error(dir / "absent.gz", "cannot open: No such file or directory");
}

TEST(IdxFile, Directory) {
  TempDir dir;
  expect_images_error(dir.path(), "cannot read: Is a directory");
}

// Becomes an unprivileged user, when root: root reads any file whatever its mode.
bool drop_root() { return ::geteuid() != 0 || (::setgid(65534) == 0 && ::setuid(65534) == 0); }

bool can_drop_root() {
  const pid_t child = ::fork();
  if (child == 0) std::_Exit(drop_root() ? 0 : 1);
  int status = 0;
  return child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(IdxFile, NoPermission) {
  if (!can_drop_root()) GTEST_SKIP() << "running as root without the right to change user";
  TempDir dir;
  fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  const fs::path path = write(dir / "secret", labels_file(3));
  fs::permissions(path, fs::perms::none);
  EXPECT_EXIT(
      {
        if (!drop_root()) std::_Exit(2);
        try {
          read_idx_labels(path);
        } catch (const InputError& e) {
          std::_Exit(std::string(e.what()) == path.string() + ": cannot open: Permission denied" ? 0 : 1);
        }
        std::_Exit(3);
      },
      ::testing::ExitedWithCode(0), "");
}

// Thousands of random corruptions of header and payload, raw and gzip, of both kinds of
// file: the reader returns a well-formed result or throws InputError, nothing else.
TEST(IdxMutation, NeverCrashesNeverAcceptsMalformedData) {
  TempDir dir;
  const Bytes originals[2] = {images_file(3), labels_file(40)};
  std::mt19937 gen(2024);
  auto below = [&](std::size_t n) { return static_cast<std::size_t>(gen() % n); };
  int rejected = 0, accepted = 0;
  for (int iteration = 0; iteration < 4000; ++iteration) {
    const bool images = iteration % 2 == 0;
    Bytes content = originals[images ? 0 : 1];
    const int mode = static_cast<int>(below(3));  // 0 raw, 1 gzip of corrupted data, 2 corrupted gzip
    if (mode == 2) content = gzip(content);
    for (std::size_t edits = 1 + below(4); edits > 0; --edits) {
      // Half the edits land in the first 16 bytes: the header (or the gzip header).
      const std::size_t at = below(2) == 0 ? below(16) : below(content.size() + 1);
      switch (below(5)) {
        case 0:
          if (at < content.size()) content[at] ^= static_cast<std::uint8_t>(1u << below(8));
          break;
        case 1:
          if (at < content.size()) content[at] = static_cast<std::uint8_t>(gen());
          break;
        case 2:
          content.resize(std::min(content.size(), at));
          break;
        case 3:
          content.insert(content.begin() + static_cast<std::ptrdiff_t>(std::min(at, content.size())),
                         static_cast<std::uint8_t>(gen()));
          break;
        default:
          if (at < content.size()) content[at] = below(2) ? 0xff : 0x00;
          break;
      }
    }
    if (mode == 1) content = gzip(content);
    // A fresh name each time: truncating a file in place can make the file system flush it.
    const fs::path path = write(dir / std::to_string(iteration), content);
    try {
      if (images) {
        const IdxImages result = read_idx_images(path);
        ASSERT_GT(result.count, 0u);
        ASSERT_EQ(result.rows, 28u);
        ASSERT_EQ(result.cols, 28u);
        ASSERT_EQ(result.pixels.size(), std::size_t{result.count} * 784);
      } else {
        const Bytes result = read_idx_labels(path);
        ASSERT_FALSE(result.empty());
        for (auto l : result) ASSERT_LE(l, 9);
      }
      ++accepted;
    } catch (const InputError& e) {
      ASSERT_EQ(std::string(e.what()).rfind(path.string() + ": ", 0), 0u) << e.what();
      ++rejected;
    }
    fs::remove(path);
  }
  // The corruptions really exercise the error paths, and some (a changed pixel) are valid.
  EXPECT_GT(rejected, 3000);
  EXPECT_GT(accepted, 100);
}

// The four standard files in a directory.
class DatasetDir : public ::testing::Test {
 protected:
  void put(const std::string& name, const Bytes& content, bool gz) {
    write(dir_ / (gz ? name + ".gz" : name), gz ? gzip(content) : content);
  }
  void put_all(bool gz, std::uint32_t train = 5, std::uint32_t test = 3) {
    put("train-images-idx3-ubyte", images_file(train), gz);
    put("train-labels-idx1-ubyte", labels_file(train), gz);
    put("t10k-images-idx3-ubyte", images_file(test), gz);
    put("t10k-labels-idx1-ubyte", labels_file(test), gz);
  }
  TempDir dir_;
};

TEST_F(DatasetDir, LoadsRawFiles) {
  put_all(false);
  const Dataset data = load_dataset(dir_.path());
  EXPECT_EQ(data.train.size(), 5u);
  EXPECT_EQ(data.test.size(), 3u);
  EXPECT_EQ(data.train.images.size(), 5 * kImageBytes);
  EXPECT_EQ(data.test.labels, (Bytes{0, 1, 2}));
}

TEST_F(DatasetDir, LoadsGzipFiles) {
  put_all(true);
  const Dataset data = load_dataset(dir_.path());
  EXPECT_EQ(data.train.size(), 5u);
  EXPECT_EQ(data.test.size(), 3u);
  const Bytes expected = images_file(3);
  EXPECT_EQ(data.test.images, Bytes(expected.begin() + 16, expected.end()));
}

TEST_F(DatasetDir, PrefersTheRawFileWhenBothExist) {
  put_all(true);
  put("train-images-idx3-ubyte", images_file(5, 28, 28, 99), false);
  const Bytes expected = images_file(5, 28, 28, 99);
  EXPECT_EQ(load_dataset(dir_.path()).train.images, Bytes(expected.begin() + 16, expected.end()));
}

TEST_F(DatasetDir, MissingFileIsNamed) {
  put_all(false);
  fs::remove(dir_ / "t10k-labels-idx1-ubyte");
  expect_error(dir_ / "t10k-labels-idx1-ubyte", [&] { load_dataset(dir_.path()); }, "not found");
}

TEST_F(DatasetDir, CountMismatchNamesBothFiles) {
  put_all(false);
  put("train-labels-idx1-ubyte", labels_file(4), false);
  const fs::path images = dir_ / "train-images-idx3-ubyte";
  const fs::path labels = dir_ / "train-labels-idx1-ubyte";
  expect_error(images, [&] { load_dataset(dir_.path()); }, "5 images, but " + labels.string() + " has 4 labels");
}

TEST_F(DatasetDir, BadFileInsideIsReported) {
  put_all(true);
  put("t10k-images-idx3-ubyte", images_file(3, 28, 14), true);
  expect_error(dir_ / "t10k-images-idx3-ubyte.gz", [&] { load_dataset(dir_.path()); }, "images are 28x14");
}

TEST(Dataset, MissingDirectory) {
  TempDir dir;
  expect_error(dir / "nowhere", [&] { load_dataset(dir / "nowhere"); },
               "cannot open data directory: No such file or directory");
}

TEST(Dataset, RealFashionMnist) {
  if (!fs::exists(kDefaultDataDir)) GTEST_SKIP() << kDefaultDataDir << " is not installed";
  const Dataset data = load_dataset(kDefaultDataDir);
  EXPECT_EQ(data.train.size(), 60000u);
  EXPECT_EQ(data.test.size(), 10000u);
  EXPECT_EQ(data.train.images.size(), 60000 * kImageBytes);
  EXPECT_EQ(data.test.images.size(), 10000 * kImageBytes);
  std::size_t per_class[kClasses] = {};
  for (auto l : data.train.labels) ++per_class[l];
  for (auto n : per_class) EXPECT_EQ(n, 6000u);  // Fashion-MNIST is balanced
}

}  // namespace
}  // namespace mnist_mt
