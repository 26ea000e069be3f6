#pragma once
// Rank 0's checkpoint writer: refuses a non-finite model (the last good checkpoint must
// survive a diverged run) and keeps the last N checkpoints, removing the oldest only
// once the new one is complete. Their names: mnist_mt/numbered_checkpoints.hpp.
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <optional>

#include "mnist_mt/checkpoint.hpp"

namespace mnist_mt {

class Saver {
 public:
  // keep <= 1: every save replaces `path`. keep > 1: each save is its own file,
  // "<stem>.step-<STEP><ext>" beside `path`, and `path` is a hard link to the latest.
  // A symbolic link at `path` is written through: the files go beside its target.
  explicit Saver(std::uint32_t keep) : keep_(keep) {}
  // Throws RuntimeFailure for a non-finite model or a failed write; `path` then holds
  // what it held before. The same position saved again to the same path, with no more
  // known of it (a stop right after an epoch's end), writes nothing: no step was taken.
  void save(const std::filesystem::path& path, const Checkpoint& checkpoint);

 private:
  struct Saved {
    std::filesystem::path path;
    std::uint32_t epoch, epoch_step;
    std::uint64_t step;
    std::optional<double> test_accuracy;
    bool operator==(const Saved&) const = default;
  };
  std::uint32_t keep_;
  std::deque<std::filesystem::path> kept_;  // this run's numbered files, oldest first
  std::optional<Saved> last_;               // this run's last save
};

// Refuses (InputError naming `what` and the path, tagged `input`) an output path that
// the rule of every output refuses (check_output, mnist_mt/file_io.hpp): checked before
// training starts.
void check_output_path(const std::filesystem::path& path, const char* what, const char* input);

// Runs `write`, one of the run's writes to an output that check_output_path passed at
// the start: an InputError it throws (its directory removed since, its temp file not
// made) is then no bad input but a runtime failure, and is rethrown as one, same text.
void runtime_write(const std::function<void()>& write);

}  // namespace mnist_mt
