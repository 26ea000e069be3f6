#include "saver.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <system_error>

#include "mnist_mt/file_io.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

bool finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

}  // namespace

std::filesystem::path numbered_checkpoint(const std::filesystem::path& path, std::uint64_t step) {
  std::filesystem::path out = path;
  out.replace_filename(path.stem().string() + ".step-" + std::to_string(step) + path.extension().string());
  return out;
}

bool is_numbered_checkpoint(const std::filesystem::path& path, std::string_view name) {
  const std::string prefix = path.stem().string() + ".step-", suffix = path.extension().string();
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix)) return false;
  const std::string_view step = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  return std::all_of(step.begin(), step.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::filesystem::path> numbered_checkpoints(const std::filesystem::path& path) {
  const std::filesystem::path target = output_target(path);
  const std::filesystem::path dir = target.parent_path().empty() ? "." : target.parent_path();
  std::vector<std::filesystem::path> found;
  std::error_code ec;  // a directory that cannot be listed is reported by the checks of `path`
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_numbered_checkpoint(target, it->path().filename().string())) found.push_back(it->path());
  return found;
}

void Saver::save(const std::filesystem::path& path, const Checkpoint& checkpoint) {
  if (!finite(checkpoint.params) || !finite(checkpoint.state.first) || !finite(checkpoint.state.second)) {
    throw RuntimeFailure("the model holds a non-finite value at step " + std::to_string(checkpoint.step) +
                         "; not saved, " + path.string() + " keeps the last good checkpoint");
  }
  if (keep_ <= 1) {
    save_checkpoint(path, checkpoint);
    return;
  }
  const std::filesystem::path target = output_target(path);
  const std::filesystem::path numbered = numbered_checkpoint(target, checkpoint.step);
  // A killed save of another step left its temp file under that step's name.
  remove_dead_temp_files(numbered.parent_path().empty() ? "." : numbered.parent_path(),
                         [&](std::string_view name) { return is_numbered_checkpoint(target, name); });
  save_checkpoint(numbered, checkpoint);
  link_atomically(numbered, target);
  if (kept_.empty() || kept_.back() != numbered) kept_.push_back(numbered);
  while (kept_.size() > keep_) {
    std::error_code ignored;  // a file the user removed already is no failure
    std::filesystem::remove(kept_.front(), ignored);
    kept_.pop_front();
  }
}

void check_output_path(const std::filesystem::path& path, const char* what, const char* input) {
  try {
    check_output(path);
  } catch (const InputError& e) {
    throw InputError(std::string(what) + " " + e.what(), input);
  }
}

}  // namespace mnist_mt
