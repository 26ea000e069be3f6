#include "saver.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>
#include <system_error>

#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

bool finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// Points `path` at `target` atomically: a hard link under a temp name, renamed over it.
void link_latest(const std::filesystem::path& target, const std::filesystem::path& path) {
  std::filesystem::path temp = path;
  temp.replace_filename("." + path.filename().string() + ".link-" + std::to_string(::getpid()));
  std::error_code ec;
  std::filesystem::remove(temp, ec);
  std::filesystem::create_hard_link(target, temp, ec);
  if (!ec) std::filesystem::rename(temp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw RuntimeFailure(path.string() + ": cannot link it to " + target.string() + ": " + ec.message());
  }
}

}  // namespace

std::filesystem::path numbered_checkpoint(const std::filesystem::path& path, std::uint64_t step) {
  std::filesystem::path out = path;
  out.replace_filename(path.stem().string() + ".step-" + std::to_string(step) + path.extension().string());
  return out;
}

void Saver::save(const std::filesystem::path& path, const Checkpoint& checkpoint) {
  if (!finite(checkpoint.params) || !finite(checkpoint.momentum)) {
    throw RuntimeFailure("the model holds a non-finite value at step " + std::to_string(checkpoint.step) +
                         "; not saved, " + path.string() + " keeps the last good checkpoint");
  }
  if (keep_ <= 1) {
    save_checkpoint(path, checkpoint);
    return;
  }
  const std::filesystem::path numbered = numbered_checkpoint(path, checkpoint.step);
  save_checkpoint(numbered, checkpoint);
  link_latest(numbered, path);
  if (kept_.empty() || kept_.back() != numbered) kept_.push_back(numbered);
  while (kept_.size() > keep_) {
    std::error_code ignored;  // a file the user removed already is no failure
    std::filesystem::remove(kept_.front(), ignored);
    kept_.pop_front();
  }
}

void check_output_path(const std::filesystem::path& path, const char* what, const char* input) {
  const std::filesystem::path dir = path.parent_path().empty() ? "." : path.parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw InputError(std::string(what) + " " + path.string() + ": directory " + dir.string() + " does not exist",
                     input);
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw InputError(std::string(what) + " " + path.string() + ": directory " + dir.string() +
                         " is not writable: " + std::strerror(errno),
                     input);
  }
  if (std::filesystem::is_directory(path, ec)) {
    throw InputError(std::string(what) + " " + path.string() + " is a directory", input);
  }
  if (std::filesystem::exists(path, ec) && ::access(path.c_str(), W_OK) != 0) {
    throw InputError(std::string(what) + " " + path.string() + " is not writable: " + std::strerror(errno), input);
  }
}

}  // namespace mnist_mt
