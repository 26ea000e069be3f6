#include "idx.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mnist_mt/gunzip.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxLabel = kClasses - 1;
// Gzip is recognised by its content, never by the file name.
constexpr std::array<std::uint8_t, 2> kGzipMagic = {0x1f, 0x8b};
// Deflate codes at most 258 bytes in 2 bits: no gzip file decompresses to more than
// 1032 times its size, so larger declared sizes are rejected before reading.
constexpr std::uint64_t kMaxDeflateRatio = 1032;
// Decompressed data grows the buffer by at most this much (or by doubling), so memory
// follows the bytes actually read, not the declared size.
constexpr std::size_t kReadChunk = std::size_t{1} << 20;
// Compressed bytes read from the file at a time.
constexpr std::size_t kCompressedChunk = std::size_t{128} << 10;

[[noreturn]] void fail(const fs::path& path, const std::string& problem) {
  throw InputError(path.string() + ": " + problem);
}

std::string hex32(std::uint32_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s = "0x00000000";
  for (int i = 0; i < 8; ++i) s[9 - i] = kDigits[(v >> (4 * i)) & 0xf];
  return s;
}

std::uint32_t big_endian32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// The bytes of one IDX file, raw or gzip, read front to back. Every I/O, zlib or
// framing failure becomes an InputError naming the file.
class IdxSource {
 public:
  // O_NONBLOCK: opening a FIFO or a device must not wait for a writer; only a regular
  // file is read, and on those the flag changes nothing.
  explicit IdxSource(const fs::path& path)
      : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)) {
    if (fd_.get() < 0) fail(path_, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) fail(path_, std::string("cannot stat: ") + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) fail(path_, std::string("cannot read: ") + std::strerror(EISDIR));
    if (!S_ISREG(st.st_mode)) fail(path_, "cannot read: not a regular file");
    file_bytes_ = static_cast<std::uint64_t>(st.st_size);

    std::array<std::uint8_t, 2> magic{};
    const std::size_t got = read_raw(magic.data(), magic.size());
    if (got == magic.size() && magic == kGzipMagic) {
      inflater_ = std::make_unique<GzipInflater>();
      compressed_.resize(kCompressedChunk);
      std::copy(magic.begin(), magic.end(), compressed_.begin());
      in_ = std::span(compressed_.data(), magic.size());
    } else {
      pending_ = magic;
      pending_end_ = got;
    }
  }

  const fs::path& path() const { return path_; }
  bool gzip() const { return inflater_ != nullptr; }

  // Rejects a declared total size the file cannot hold, before anything is allocated.
  void check_declared(std::uint64_t total) const {
    if (!gzip()) {
      if (total > file_bytes_)
        fail(path_, "truncated payload: header declares " + std::to_string(total) + " bytes, file has " +
                        std::to_string(file_bytes_));
      if (total < file_bytes_)
        fail(path_, "trailing bytes: header declares " + std::to_string(total) + " bytes, file has " +
                        std::to_string(file_bytes_) + " (" + std::to_string(file_bytes_ - total) + " extra)");
    } else if (total / kMaxDeflateRatio > file_bytes_) {
      fail(path_, "truncated payload: header declares " + std::to_string(total) + " bytes, more than a " +
                      std::to_string(file_bytes_) + "-byte gzip file can hold");
    }
  }

  // Reads up to n bytes; fewer only at the end of the data.
  std::size_t read(std::uint8_t* dst, std::size_t n) {
    std::size_t done = 0;
    for (; done < n && pending_next_ < pending_end_; ++done) dst[done] = pending_[pending_next_++];
    done += gzip() ? read_gzip(dst + done, n - done) : read_raw(dst + done, n - done);
    consumed_ += done;
    return done;
  }

  // Requires the end of the data here (and so of the file, at the end of a gzip member).
  void finish() {
    std::array<std::uint8_t, 4096> scratch{};
    std::uint64_t extra = 0;
    for (std::size_t got; (got = read(scratch.data(), scratch.size())) > 0;) extra += got;
    if (extra > 0)
      fail(path_, "trailing bytes: " + std::to_string(extra) + " after the " + std::to_string(consumed_ - extra) +
                      " bytes the header declares" + (gzip() ? " (decompressed)" : ""));
  }

 private:
  std::size_t read_raw(std::uint8_t* dst, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      const ssize_t got = ::read(fd_.get(), dst + done, n - done);
      if (got == 0) break;
      if (got < 0) {
        if (errno == EINTR) continue;
        fail(path_, std::string("read error: ") + std::strerror(errno));
      }
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

  std::size_t read_gzip(std::uint8_t* dst, std::size_t n) {
    std::span<std::uint8_t> out(dst, n);
    while (!out.empty()) {
      if (in_.empty()) {
        if (end_of_file_) {  // the data ends here: it must be at the end of a member
          if (const auto problem = inflater_->finish()) fail(path_, *problem);
          break;
        }
        const std::size_t got = read_raw(compressed_.data(), compressed_.size());
        end_of_file_ = got < compressed_.size();
        in_ = std::span(compressed_.data(), got);
      }
      if (const auto problem = inflater_->inflate(in_, out)) fail(path_, *problem);
    }
    return n - out.size();
  }

  fs::path path_;
  Fd fd_;
  std::unique_ptr<GzipInflater> inflater_;  // null: a raw file
  std::vector<std::uint8_t> compressed_;    // gzip: what was read of the file
  std::span<const std::uint8_t> in_;        // gzip: the part of it not inflated yet
  bool end_of_file_ = false;
  std::uint64_t file_bytes_ = 0;
  std::uint64_t consumed_ = 0;
  std::array<std::uint8_t, 2> pending_{};  // bytes read while sniffing for gzip
  std::size_t pending_next_ = 0;
  std::size_t pending_end_ = 0;
};

// Reads the magic and `Dims` big-endian dimensions.
template <std::size_t Dims>
std::array<std::uint32_t, Dims> read_header(IdxSource& src, std::uint32_t magic, const char* kind) {
  std::array<std::uint8_t, 4 + 4 * Dims> raw{};
  const std::size_t got = src.read(raw.data(), raw.size());
  if (got >= 4) {
    const std::uint32_t found = big_endian32(raw.data());
    if (found != magic) {
      std::string problem = "wrong magic " + hex32(found) + ", expected " + hex32(magic) + " (IDX " + kind + ")";
      if (found == kIdxImagesMagic) problem += "; this is an IDX images file";
      if (found == kIdxLabelsMagic) problem += "; this is an IDX labels file";
      if (found >> 16 == 0x1f8bu) problem += "; gzip-compressed twice?";
      fail(src.path(), problem);
    }
  }
  if (got < raw.size())
    fail(src.path(), "truncated header: expected " + std::to_string(raw.size()) + " bytes, got " + std::to_string(got));
  std::array<std::uint32_t, Dims> dims{};
  for (std::size_t i = 0; i < Dims; ++i) dims[i] = big_endian32(raw.data() + 4 + 4 * i);
  return dims;
}

// Reads exactly `bytes` payload bytes, then requires the end of the file.
std::vector<std::uint8_t> read_payload(IdxSource& src, std::uint64_t header_bytes, std::uint64_t bytes) {
  src.check_declared(header_bytes + bytes);
  if (bytes > std::numeric_limits<std::size_t>::max() / 2)
    fail(src.path(), "declared size " + std::to_string(bytes) + " bytes is too large");
  const auto want = static_cast<std::size_t>(bytes);
  std::vector<std::uint8_t> data;
  // Raw files were checked against their size: allocate once. Gzip: grow with the data.
  if (!src.gzip()) data.reserve(want);
  while (data.size() < want) {
    if (data.size() == data.capacity()) data.reserve(std::min(want, std::max(kReadChunk, 2 * data.size())));
    const std::size_t old = data.size();
    const std::size_t ask = std::min(want - old, data.capacity() - old);
    data.resize(old + ask);
    const std::size_t got = src.read(data.data() + old, ask);
    if (got < ask)
      fail(src.path(), "truncated payload: expected " + std::to_string(header_bytes + bytes) + " bytes, got " +
                           std::to_string(header_bytes + old + got) + (src.gzip() ? " (decompressed)" : ""));
  }
  src.finish();
  return data;
}

}  // namespace

IdxImages read_idx_images(const fs::path& path) {
  IdxSource src(path);
  const auto [count, rows, cols] = read_header<3>(src, kIdxImagesMagic, "images");
  if (count == 0) fail(path, "zero count: the file declares no images");
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(std::uint64_t{count}, std::uint64_t{rows}, &bytes) ||
      __builtin_mul_overflow(bytes, std::uint64_t{cols}, &bytes))
    fail(path, "declared size " + std::to_string(count) + "x" + std::to_string(rows) + "x" + std::to_string(cols) +
                   " overflows 64 bits");
  if (rows != kImageSide || cols != kImageSide)
    fail(path, "images are " + std::to_string(rows) + "x" + std::to_string(cols) + ", expected 28x28");
  IdxImages images;
  images.count = count;
  images.rows = rows;
  images.cols = cols;
  images.pixels = read_payload(src, 16, bytes);
  return images;
}

std::vector<std::uint8_t> read_idx_labels(const fs::path& path) {
  IdxSource src(path);
  const auto [count] = read_header<1>(src, kIdxLabelsMagic, "labels");
  if (count == 0) fail(path, "zero count: the file declares no labels");
  std::vector<std::uint8_t> labels = read_payload(src, 8, count);
  const auto bad = std::find_if(labels.begin(), labels.end(), [](std::uint8_t l) { return l > kMaxLabel; });
  if (bad != labels.end())
    fail(path, "label " + std::to_string(*bad) + " at index " + std::to_string(bad - labels.begin()) +
                   " is out of range 0..9");
  return labels;
}

}  // namespace mnist_mt
