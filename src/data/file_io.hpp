#pragma once
// Whole-file reads with a size bound, and atomic writes: a temp file beside the
// target, fsync, rename, fsync of the directory (DESIGN.md decisions 8 and 14).
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace mnist_mt {

// The file's bytes. Throws InputError("<path>: <problem>") when it cannot be read, is
// not a regular file, or holds more than max_bytes.
std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path, std::uint64_t max_bytes);

// Written in pieces, then committed: until commit() the target is untouched, and a
// file that is never committed leaves nothing behind. Errors throw naming the target:
// InputError when the temp file cannot be made or renamed (the path is wrong),
// RuntimeFailure when a write, fsync or close fails (a full disk, a file size limit).
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t bytes);
  // fsync, rename over the target, fsync of its directory.
  void commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// One call: the whole content, atomically.
void write_file_atomically(const std::filesystem::path& target, std::span<const std::uint8_t> bytes);

}  // namespace mnist_mt
