#pragma once
// The names of the numbered checkpoints that `train --keep N` (N > 1) writes beside
// --save: "<stem>.step-<STEP><ext>". The CLI refuses an output that would take one of
// their names; the trainer's saver writes them.
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

namespace mnist_mt {

// "<stem>.step-<STEP><ext>" beside `path`.
std::filesystem::path numbered_checkpoint(const std::filesystem::path& path, std::uint64_t step);
// Whether the file name `name` is one of `path`'s numbered checkpoints.
bool is_numbered_checkpoint(const std::filesystem::path& path, std::string_view name);
// Those present beside `path`'s final target (symbolic links followed).
std::vector<std::filesystem::path> numbered_checkpoints(const std::filesystem::path& path);

}  // namespace mnist_mt
