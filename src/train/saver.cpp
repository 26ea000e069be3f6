#include "saver.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <system_error>

#include "mnist_mt/file_io.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/numbered_checkpoints.hpp"

namespace mnist_mt {
namespace {

bool finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

}  // namespace

void Saver::save(const std::filesystem::path& path, const Checkpoint& checkpoint) {
  const Saved saving{path, checkpoint.epoch, checkpoint.epoch_step, checkpoint.step, checkpoint.test_accuracy};
  if (last_ == saving) return;
  if (!finite(checkpoint.params) || !finite(checkpoint.state.first) || !finite(checkpoint.state.second)) {
    throw RuntimeFailure("the model holds a non-finite value at step " + std::to_string(checkpoint.step) +
                         "; not saved, " + path.string() + " keeps the last good checkpoint");
  }
  if (keep_ <= 1) {
    runtime_write([&] { save_checkpoint(path, checkpoint); });
    last_ = saving;
    return;
  }
  const std::filesystem::path target = output_target(path);
  const std::filesystem::path numbered = numbered_checkpoint(target, checkpoint.step);
  // A killed save of another step left its temp file under that step's name.
  remove_dead_temp_files(numbered.parent_path().empty() ? "." : numbered.parent_path(),
                         [&](std::string_view name) { return is_numbered_checkpoint(target, name); });
  runtime_write([&] { save_checkpoint(numbered, checkpoint); });
  link_atomically(numbered, target);
  if (kept_.empty() || kept_.back() != numbered) kept_.push_back(numbered);
  while (kept_.size() > keep_) {
    std::error_code ignored;  // a file the user removed already is no failure
    std::filesystem::remove(kept_.front(), ignored);
    kept_.pop_front();
  }
  last_ = saving;
}

void runtime_write(const std::function<void()>& write) {
  try {
    write();
  } catch (const InputError& e) {
    throw RuntimeFailure(e.what());
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
