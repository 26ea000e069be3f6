#include "mnist_mt/file_io.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <charconv>
#include <cstring>
#include <string>
#include <system_error>

#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

namespace fs = std::filesystem;

// Linux's own limit on the links one lookup follows.
constexpr int kMaxLinks = 40;
constexpr std::string_view kTempMark = ".tmp-";

std::string shown(const fs::path& path) { return path.empty() ? "''" : path.string(); }

[[noreturn]] void fail(const fs::path& path, const std::string& problem) {
  throw InputError(shown(path) + ": " + problem);
}

// A write that fails once the file is open (a full disk, a file size limit) is a
// runtime failure, not bad input: the path was fine.
[[noreturn]] void fail_write(const fs::path& path, const std::string& problem) {
  throw RuntimeFailure(shown(path) + ": " + problem);
}

std::string errno_text() { return std::strerror(errno); }

fs::path directory_of(const fs::path& path) { return path.parent_path().empty() ? "." : path.parent_path(); }

std::string not_regular(mode_t mode) {
  const char* kind = S_ISDIR(mode)    ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO"
                     : S_ISSOCK(mode) ? "a socket"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                                      : "something";
  return std::string(kind) + ", not a regular file";
}

// A world-writable sticky directory (/tmp) holds other users' names: a link there is
// not ours to follow, nor a file ours to replace, unless we or the directory own it.
void refuse_foreign(const fs::path& shown_path, const fs::path& path, const struct stat& st, const char* what) {
  const fs::path dir = directory_of(path);
  struct stat d {};
  if (::stat(dir.c_str(), &d) != 0) return;
  const bool shared = (d.st_mode & S_ISVTX) != 0 && (d.st_mode & S_IWOTH) != 0;
  if (shared && st.st_uid != ::geteuid() && st.st_uid != d.st_uid)
    fail(shown_path, std::string(what) + " of another user in the shared directory " + dir.string());
}

// The rename is durable only once the directory entry is on disk.
void sync_directory(const fs::path& target) {
  const fs::path dir = directory_of(target);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(target, "cannot open its directory to fsync: " + errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) fail(target, "cannot fsync its directory: " + errno_text());
}

// Tries fresh temp names beside `target` until `make(name)` (which sets errno) works,
// after removing those of writers that are gone; the name made, or empty.
template <typename Make>
fs::path make_temp(const fs::path& target, Make&& make) {
  static std::atomic<unsigned> counter{0};
  const std::string name = target.filename().string();
  remove_dead_temp_files(directory_of(target), [&](std::string_view of) { return of == name; });
  for (int attempt = 0; attempt < 100; ++attempt) {
    // Hidden, never mistaken for the file it becomes, and naming its writer.
    fs::path temp = target;
    temp.replace_filename("." + name + std::string(kTempMark) + std::to_string(::getpid()) + "-" +
                          std::to_string(counter++));
    if (make(temp)) return temp;
    if (errno != EEXIST) break;
  }
  return {};
}

}  // namespace

std::vector<std::uint8_t> read_file_bytes(const fs::path& path, std::uint64_t max_bytes) {
  // Refused before open: opening a device can act (a tape rewinds, a watchdog starts).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, "cannot open: " + errno_text());
  if (!S_ISREG(st.st_mode)) fail(path, not_regular(st.st_mode));
  // O_NONBLOCK: a FIFO put there since is opened without waiting for a writer, then refused.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: " + errno_text());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0) fail(path, "cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) fail(path, not_regular(st.st_mode));
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

fs::path replaceable_target(const fs::path& path) {
  if (path.empty()) fail(path, "an empty path names no file");
  struct stat st {};
  // stat, not the link chain, first: /dev/stdout's last link names no path ("pipe:[N]").
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) fail(path, not_regular(st.st_mode));
  const fs::path target = output_target(path);
  if (::lstat(target.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) fail(path, not_regular(st.st_mode));
    refuse_foreign(path, target, st, "a file");
  }
  return target;
}

fs::path output_target(const fs::path& path) {
  if (path.empty()) fail(path, "an empty path names no file");
  fs::path at = path;
  for (int links = 0;; ++links) {
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return at;
    if (links == kMaxLinks) fail(path, "too many levels of symbolic links");
    refuse_foreign(path, at, st, "a link");
    // /proc's links report a size of 64 whatever they hold.
    std::string link(std::max<std::size_t>(static_cast<std::size_t>(st.st_size), 4096) + 1, '\0');
    const ssize_t n = ::readlink(at.c_str(), link.data(), link.size());
    if (n < 0 || static_cast<std::size_t>(n) == link.size()) fail(path, "cannot read the link " + at.string());
    link.resize(static_cast<std::size_t>(n));
    at = at.parent_path() / link;  // an absolute link replaces the whole path
  }
}

void check_output(const fs::path& path) {
  const fs::path target = replaceable_target(path);
  const fs::path dir = directory_of(target);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) fail(path, "directory " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) fail(path, "directory " + dir.string() + " is not writable: " + errno_text());
  if (::access(target.c_str(), F_OK) == 0 && ::access(target.c_str(), W_OK) != 0)
    fail(path, "not writable: " + errno_text());
}

bool same_file(const fs::path& a, const fs::path& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa {}, sb {};
  const bool a_exists = ::stat(a.c_str(), &sa) == 0, b_exists = ::stat(b.c_str(), &sb) == 0;
  if (a_exists || b_exists) return a_exists && b_exists && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code a_error, b_error;
  const fs::path ta = fs::weakly_canonical(fs::absolute(output_target(a)), a_error);
  const fs::path tb = fs::weakly_canonical(fs::absolute(output_target(b)), b_error);
  return !a_error && !b_error && ta == tb;
}

void remove_dead_temp_files(const fs::path& dir, const std::function<bool(std::string_view)>& of_target) {
  std::error_code ec;  // best effort: a directory that cannot be listed keeps its files
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    const std::size_t mark = entry.rfind(kTempMark);
    if (entry.size() < 2 || entry[0] != '.' || mark == std::string::npos || mark < 1) continue;
    if (!of_target(std::string_view(entry).substr(1, mark - 1))) continue;
    const char* digits = entry.data() + mark + kTempMark.size();
    const char* last = entry.data() + entry.size();
    pid_t pid = 0;
    unsigned serial = 0;
    const auto [dash, pid_error] = std::from_chars(digits, last, pid);
    if (pid_error != std::errc{} || pid <= 0 || dash == last || *dash != '-') continue;
    const auto [end_of_serial, serial_error] = std::from_chars(dash + 1, last, serial);
    if (serial_error != std::errc{} || end_of_serial != last) continue;
    // ESRCH only: a process we may not signal (EPERM) is alive, and its file stays.
    if (::kill(pid, 0) != 0 && errno == ESRCH) ::unlink(it->path().c_str());
  }
}

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)), target_(replaceable_target(path_)) {
  temp_ = make_temp(target_, [this](const fs::path& temp) {
    fd_ = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    return fd_ >= 0;
  });
  if (fd_ < 0) fail(path_, "cannot create a temp file in its directory: " + errno_text());
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
    if (n <= 0) fail_write(path_, "cannot write: " + errno_text());
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail_write(path_, "cannot fsync: " + errno_text());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_write(path_, "cannot close: " + errno_text());
  if (::rename(temp_.c_str(), target_.c_str()) != 0) fail(path_, "cannot rename the temp file: " + errno_text());
  committed_ = true;
  sync_directory(target_);
}

void write_file_atomically(const fs::path& target, std::span<const std::uint8_t> bytes) {
  AtomicFile file(target);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

void link_atomically(const fs::path& existing, const fs::path& path) {
  const fs::path target = replaceable_target(path);
  const fs::path temp = make_temp(target, [&](const fs::path& name) { return ::link(existing.c_str(), name.c_str()) == 0; });
  if (temp.empty()) fail_write(path, "cannot link it to " + existing.string() + ": " + errno_text());
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const std::string problem = errno_text();
    ::unlink(temp.c_str());
    fail_write(path, "cannot link it to " + existing.string() + ": " + problem);
  }
  sync_directory(target);
}

std::optional<fs::path> env_path(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return fs::path(value);
}

fs::path cache_root() {
  if (auto xdg = env_path("XDG_CACHE_HOME")) return *xdg / "mnist_mt";
  if (auto home = env_path("HOME")) return *home / ".cache" / "mnist_mt";
  return {};
}

}  // namespace mnist_mt
