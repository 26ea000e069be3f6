#pragma once
// Whole-file reads with a size bound, and atomic writes: a temp file beside the
// target, fsync, rename, fsync of the directory (docs/architecture.md decisions 13 and 15). Every
// output follows one rule (decision 14): only our own regular files are replaced.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace mnist_mt {

// The file's bytes. Throws InputError("<path>: <problem>") when it cannot be read, is
// not a regular file (a FIFO is refused without waiting for a writer), or holds more
// than max_bytes.
std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path, std::uint64_t max_bytes);

// The file a write to `path` replaces: its symbolic links followed to the last name,
// which may not exist yet. A link is written through, never replaced.
std::filesystem::path output_target(const std::filesystem::path& path);

// The part of the rule that holds whatever the directory allows, checked again as each
// file is made; the final target. InputError("<path>: <problem>") for an empty path; a
// target that exists and is not a regular file (a device, FIFO, socket, directory);
// in a shared sticky directory such as /tmp, a link or file of another user (as
// Linux's protected_symlinks and protected_regular would refuse).
std::filesystem::path replaceable_target(const std::filesystem::path& path);

// The rule, checked before any work: replaceable_target's, and a directory that is
// missing or not writable, or a target that is not writable.
void check_output(const std::filesystem::path& path);

// Whether `a` and `b` name one file: the same inode when both exist, else the same
// final target.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

// Written in pieces, then committed: until commit() the target is untouched, and a
// file that is never committed leaves nothing behind. Errors throw naming the target:
// InputError when it breaks the rule above or the temp file cannot be made or renamed
// (the path is wrong), RuntimeFailure when a write, fsync or close fails (a full disk,
// a file size limit). The temp file, ".<name>.tmp-<pid>-<n>" beside the final target,
// is left only by a process killed mid-save; the next save to that target removes it
// once process <pid> is gone.
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
  std::filesystem::path path_;    // as given, for messages
  std::filesystem::path target_;  // where it goes: path_ with its links followed
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// One call: the whole content, atomically.
void write_file_atomically(const std::filesystem::path& target, std::span<const std::uint8_t> bytes);

// Makes `target` (links followed) a hard link to `existing` atomically: a link under a
// temp name, renamed over it. RuntimeFailure naming `target` when it cannot.
void link_atomically(const std::filesystem::path& existing, const std::filesystem::path& target);

// Removes, in `dir`, the temp files of killed writers: those of a target whose name
// `of_target` accepts, made by a process that no longer exists.
void remove_dead_temp_files(const std::filesystem::path& dir, const std::function<bool(std::string_view)>& of_target);

// The directory or file an environment variable names; nullopt when it is unset or empty.
std::optional<std::filesystem::path> env_path(const char* name);

// mnist_mt's cache: $XDG_CACHE_HOME/mnist_mt, else $HOME/.cache/mnist_mt; empty when
// neither is set (downloads, cuDNN's timed algorithm choices).
std::filesystem::path cache_root();

}  // namespace mnist_mt
