#include "mnist_mt/numbered_checkpoints.hpp"

#include <algorithm>
#include <string>
#include <system_error>

#include "mnist_mt/file_io.hpp"

namespace mnist_mt {

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

}  // namespace mnist_mt
