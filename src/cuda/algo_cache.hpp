#pragma once
// The cuDNN algorithms chosen by timing (cudnnFind*), kept in a small file from run to
// run, so that a run finds them again instead of timing every candidate at start-up.
// Keyed by what the choice depends on: the GPU and its compute capability, the cuDNN
// and CUDA versions, the convolution's shape and batch, its math. Plain C++: no CUDA
// header, so the tests check it on any machine.
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace mnist_mt::cuda {

// A convolution's three algorithms and the math type each was chosen with, as cuDNN's
// enum values; -1: not chosen (a convolution without a data gradient).
struct ConvChoice {
  int forward = -1, forward_math = 0;
  int filter = -1, filter_math = 0;
  int data = -1, data_math = 0;
  bool operator==(const ConvChoice&) const = default;
};

class AlgoCache {
 public:
  // `file` empty: choices are kept for this process only.
  explicit AlgoCache(std::filesystem::path file);

  // $MNIST_MT_CACHE_DIR, else $XDG_CACHE_HOME/mnist_mt, else $HOME/.cache/mnist_mt, with
  // the file cudnn-algorithms.txt in it; empty (no file) when MNIST_MT_CACHE_DIR is set
  // to the empty string, or none of them is set.
  static std::filesystem::path default_file();
  // The process's cache, at default_file().
  static AlgoCache& shared();

  // Thread-safe. The file is read at the first find(); an unreadable or malformed one is
  // ignored with one warning on stderr (and replaced at the next store()), one in another
  // version's format too, but left as it is.
  std::optional<ConvChoice> find(const std::string& key);
  // Keeps `choice` under `key` and rewrites the file atomically (its directory made if
  // missing), with the entries other processes wrote since it was read. A file that
  // cannot be written (a path that is not a regular file of ours, a read-only place)
  // leaves the choice in memory, with one warning on stderr: a run never fails for it.
  void store(const std::string& key, const ConvChoice& choice);

  const std::filesystem::path& file() const { return file_; }

 private:
  std::map<std::string, ConvChoice> read_file();  // entries of the file; none when absent or bad
  void warn(const std::string& what);

  std::mutex mutex_;
  std::filesystem::path file_;
  std::map<std::string, ConvChoice> entries_;
  bool loaded_ = false;
  bool warned_ = false;
  bool foreign_ = false;  // the file is another version's: never written
};

}  // namespace mnist_mt::cuda
