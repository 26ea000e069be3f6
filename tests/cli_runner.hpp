#pragma once
// Runs the mnist_mt executable as a user does (with a deadline, and a file size limit
// for a full disk), and makes small data sets for it: what the CLI tests share.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cli_test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct Outcome {
  int exit_code = -1;  // -1: killed at the deadline
  std::string out;
  std::string err;
};

inline std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A directory of this process's files, removed at exit.
inline fs::path scratch_dir() {
  struct Dir {
    Dir() : path(fs::temp_directory_path() / ("mnist_mt_cli_" + std::to_string(::getpid()))) {
      fs::create_directories(path);
    }
    ~Dir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
    fs::path path;
  };
  static const Dir dir;
  return dir.path;
}

// A running mnist_mt, its output going to files.
struct Process {
  pid_t pid = -1;
  fs::path out, err;
};

inline std::string exe_path() {
  const char* exe = std::getenv("MNIST_MT_EXE");
  if (exe == nullptr) throw std::runtime_error("MNIST_MT_EXE is not set");
  return exe;
}

// Starts `command` (a program and its arguments; the program by path or on PATH) with
// the extra environment entries "NAME=VALUE"; `file_limit` (bytes, 0: none) stands in
// for a full disk.
inline Process spawn_command(const std::vector<std::string>& command, const std::vector<std::string>& env = {},
                             rlim_t file_limit = 0) {
  static int runs = 0;
  const std::string n = std::to_string(runs++);
  Process p{-1, scratch_dir() / ("stdout" + n), scratch_dir() / ("stderr" + n)};
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  p.pid = fork();
  if (p.pid == 0) {
    const int o = open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, STDOUT_FILENO);
    dup2(e, STDERR_FILENO);
    // As at a terminal: a test runner started in the background may ignore SIGINT.
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    for (const std::string& entry : env) {
      const std::size_t eq = entry.find('=');
      setenv(entry.substr(0, eq).c_str(), entry.substr(eq + 1).c_str(), 1);
    }
    if (file_limit > 0) {
      signal(SIGXFSZ, SIG_DFL);  // as a shell leaves it: mnist_mt must ignore it itself
      const rlimit limit{file_limit, file_limit};
      setrlimit(RLIMIT_FSIZE, &limit);
    }
    execvp(argv[0], argv.data());
    _exit(127);
  }
  return p;
}

// Starts mnist_mt with `args`, as spawn_command.
inline Process spawn(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                     rlim_t file_limit = 0) {
  std::vector<std::string> command{exe_path()};
  command.insert(command.end(), args.begin(), args.end());
  return spawn_command(command, env, file_limit);
}

// Waits for the process, killing it at the deadline.
inline Outcome finish(const Process& p, std::chrono::seconds deadline = 120s) {
  Outcome outcome;
  const auto until = std::chrono::steady_clock::now() + deadline;
  int status = 0;
  while (waitpid(p.pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &status, 0);
      outcome.out = slurp(p.out);
      outcome.err = slurp(p.err);
      return outcome;
    }
    std::this_thread::sleep_for(10ms);
  }
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  outcome.out = slurp(p.out);
  outcome.err = slurp(p.err);
  return outcome;
}

// Runs mnist_mt with `args` and the extra environment entries, killing it at the deadline.
inline Outcome run_cli(const std::vector<std::string>& args, std::chrono::seconds deadline = 120s,
                       const std::vector<std::string>& env = {}) {
  return finish(spawn(args, env), deadline);
}

inline void write_be32(std::ofstream& f, std::uint32_t v) {
  const char bytes[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  f.write(bytes, 4);
}

// A small MNIST-format data set: noise plus a square placed by the label.
inline void write_split(const fs::path& dir, const std::string& prefix, std::uint32_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::ofstream images(dir / (prefix + "-images-idx3-ubyte"), std::ios::binary);
  std::ofstream labels(dir / (prefix + "-labels-idx1-ubyte"), std::ios::binary);
  write_be32(images, 0x803);
  write_be32(images, n);
  write_be32(images, 28);
  write_be32(images, 28);
  write_be32(labels, 0x801);
  write_be32(labels, n);
  for (std::uint32_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng() % 10);
    labels.put(static_cast<char>(label));
    for (int y = 0; y < 28; ++y) {
      for (int x = 0; x < 28; ++x) {
        const bool square = y / 14 == label / 5 && x / 5 == label % 5 && y % 14 > 3;
        images.put(static_cast<char>(square ? 255 : rng() % 64));
      }
    }
  }
}

// A data set of `train` and `test` images in the scratch directory's `name`.
inline fs::path make_data(const std::string& name, std::uint32_t train, std::uint32_t test, unsigned seed) {
  fs::path d = scratch_dir() / name;
  fs::create_directories(d);
  write_split(d, "train", train, seed);
  write_split(d, "t10k", test, seed + 1);
  return d;
}

inline const fs::path& small_data() {
  static const fs::path dir = make_data("data", 256, 50, 1);
  return dir;
}

inline int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace cli_test
