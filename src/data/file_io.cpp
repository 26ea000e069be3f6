#include "file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const fs::path& path, const std::string& problem) {
  throw InputError(path.string() + ": " + problem);
}

// A write that fails once the file is open (a full disk, a file size limit) is a
// runtime failure, not bad input: the path was fine.
[[noreturn]] void fail_write(const fs::path& path, const std::string& problem) {
  throw RuntimeFailure(path.string() + ": " + problem);
}

std::string errno_text() { return std::strerror(errno); }

// The rename is durable only once the directory entry is on disk.
void sync_directory(const fs::path& target) {
  const fs::path dir = target.parent_path().empty() ? "." : target.parent_path();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(target, "cannot open its directory to fsync: " + errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) fail(target, "cannot fsync its directory: " + errno_text());
}

}  // namespace

std::vector<std::uint8_t> read_file_bytes(const fs::path& path, std::uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: " + errno_text());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, "cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes)
    fail(path, std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) + " expected");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "cannot read: " + errno_text());
    if (n == 0) fail(path, "file shrank while being read");
    done += static_cast<std::size_t>(n);
  }
  return bytes;
}

AtomicFile::AtomicFile(fs::path target) : target_(std::move(target)) {
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    // Hidden, and never mistaken for the file it becomes.
    const std::string name = "." + target_.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                             std::to_string(counter++);
    temp_ = target_;
    temp_.replace_filename(name);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0) fail(target_, "cannot create a temp file in its directory: " + errno_text());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_write(target_, "cannot write: " + errno_text());
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail_write(target_, "cannot fsync: " + errno_text());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_write(target_, "cannot close: " + errno_text());
  if (::rename(temp_.c_str(), target_.c_str()) != 0) fail(target_, "cannot rename the temp file: " + errno_text());
  committed_ = true;
  sync_directory(target_);
}

void write_file_atomically(const fs::path& target, std::span<const std::uint8_t> bytes) {
  AtomicFile file(target);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

}  // namespace mnist_mt
