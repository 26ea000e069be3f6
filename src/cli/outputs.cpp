#include "outputs.hpp"

#include <poll.h>
#include <unistd.h>

#include <iostream>
#include <system_error>

#include "mnist_mt/catalog.hpp"
#include "mnist_mt/file_io.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/numbered_checkpoints.hpp"

namespace mnist_mt::cli {
namespace {

namespace fs = std::filesystem;

template <typename Check>
void naming_flag(const RunFile& file, Check&& check) {
  try {
    check();
  } catch (const InputError& e) {
    throw InputError(file.flag + ": " + e.what());
  }
}

std::string clash(const RunFile& file, const RunFile& other) {
  if ((file.checkpoint && other.checkpoint) || !same_file(file.path, other.path)) return "";
  return file.path.string() + ": the same file as " + other.flag + " " + other.path.string();
}

// The same directory, links followed: the numbered checkpoints lie beside --save's target.
bool same_directory(const fs::path& a, const fs::path& b) {
  std::error_code ea, eb;
  const fs::path da = fs::weakly_canonical(fs::absolute(a.parent_path().empty() ? "." : a.parent_path()), ea);
  const fs::path db = fs::weakly_canonical(fs::absolute(b.parent_path().empty() ? "." : b.parent_path()), eb);
  return !ea && !eb && da == db;
}

}  // namespace

void add_data_files(const DataFlags& f, RunFiles& files) {
  fs::path dir;
  try {
    dir = find_data(f).dir;
  } catch (const InputError&) {
    return;  // load_data says why
  }
  for (const FileSpec& spec : dataset_spec(dataset_kind(f)).files) {
    const fs::path raw = dir / spec.name, gz = dir / (spec.name + ".gz");
    std::error_code ec;
    if (fs::exists(raw, ec)) files.inputs.push_back({raw, "the data file"});
    if (f.download) {
      files.maybe_outputs.push_back({gz, "--download"});
    } else if (fs::exists(gz, ec)) {
      files.inputs.push_back({gz, "the data file"});
    }
  }
}

void check_run_files(const RunFiles& files) {
  for (const RunFile& file : files.outputs) naming_flag(file, [&] { check_output(file.path); });
  std::vector<RunFile> outputs = files.outputs;
  outputs.insert(outputs.end(), files.maybe_outputs.begin(), files.maybe_outputs.end());
  if (files.numbered) {
    const fs::path save = output_target(*files.numbered);
    for (const RunFile& file : files.outputs) {
      const fs::path target = output_target(file.path);
      if (!file.checkpoint && same_directory(target, save) && is_numbered_checkpoint(save, target.filename().string()))
        throw InputError(file.flag + ": " + file.path.string() + ": named as one of --save's numbered checkpoints (--keep)");
    }
    for (const fs::path& numbered : numbered_checkpoints(save)) outputs.push_back({numbered, "--keep", true});
  }
  for (std::size_t i = files.outputs.size(); i < outputs.size(); ++i)
    naming_flag(outputs[i], [&] { replaceable_target(outputs[i].path); });
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j)
      if (const std::string problem = clash(outputs[i], outputs[j]); !problem.empty())
        throw InputError(outputs[i].flag + ": " + problem);
    for (const RunFile& input : files.inputs)
      if (const std::string problem = clash(outputs[i], input); !problem.empty())
        throw InputError(outputs[i].flag + ": " + problem + ", which it would replace");
  }
}

std::optional<std::string> checkpoint_problem(const fs::path& path, const RunFiles& files) {
  try {
    check_output(path);
  } catch (const InputError& e) {
    return e.what();
  }
  const RunFile file{path, "", true};
  for (const auto* group : {&files.outputs, &files.maybe_outputs, &files.inputs})
    for (const RunFile& other : *group)
      if (std::string problem = clash(file, other); !problem.empty()) return problem;
  return std::nullopt;
}

std::string one_line(std::string_view text) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string line;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte != 0x7f)
      line += c;
    else
      line += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
  }
  return line;
}

void finish_stdout() {
  if (std::cout.flush()) return;
  // A pipe whose reader is gone polls as an error.
  pollfd out{STDOUT_FILENO, POLLOUT, 0};
  if (::poll(&out, 1, 0) == 1 && (out.revents & (POLLERR | POLLHUP)) != 0) {
    std::cerr << "mnist_mt: standard output was closed before the end (its reader stopped reading)" << std::endl;
    return;
  }
  throw RuntimeFailure("standard output: cannot write the results");
}

}  // namespace mnist_mt::cli
