#pragma once
// The rule of every file a command writes (docs/architecture.md decision 14), applied before any
// work: each output passes check_output (mnist_mt/file_io.hpp) and is no other output's
// file nor an input's, but a checkpoint may replace the checkpoint the run continues.
// And the end of stdout, where the results go: a reader that stopped early is no failure.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "options.hpp"

namespace mnist_mt::cli {

struct RunFile {
  std::filesystem::path path;
  std::string flag;         // what an error names: "--metrics", "the data file"
  bool checkpoint = false;  // two checkpoints may be one file: --save replaces --load
};

struct RunFiles {
  std::vector<RunFile> outputs;
  // Outputs written only when needed (a download, a numbered checkpoint of an earlier
  // run): held to replaceable_target, since their directory need not be writable.
  std::vector<RunFile> maybe_outputs;
  std::vector<RunFile> inputs;
  // --save when --keep > 1: its numbered checkpoints present are outputs too, and no
  // other output may be named as one.
  std::optional<std::filesystem::path> numbered;
};

// The files of the data set the run reads, as the data flags lead to them; with
// --download, the .gz files it may write. Nothing when there are none (load_data
// then says why).
void add_data_files(const DataFlags& f, RunFiles& files);

// InputError "FLAG: PATH: problem" for the first file the rule refuses.
void check_run_files(const RunFiles& files);
// The problem with one more checkpoint output among `files`, or nothing.
std::optional<std::string> checkpoint_problem(const std::filesystem::path& path, const RunFiles& files);

// `text` as one line of a terminal: each control character (a newline in a path, an
// escape sequence in a file name) written as \xNN.
std::string one_line(std::string_view text);

// After the files are written: a reader that closed stdout early (`| head`) is told on
// stderr; any other write error on stdout lost the results (RuntimeFailure).
void finish_stdout();

}  // namespace mnist_mt::cli
