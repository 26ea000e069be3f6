// The mnist_mt executable as a user runs it: bad flags exit 2 with one line naming the
// flag, a run on a small data set writes its metrics, an injected fault exits 3 with
// the rank and step, and nothing hangs (every run has a deadline).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
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
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct Outcome {
  int exit_code = -1;  // -1: killed at the deadline
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A directory of this process's files, removed at exit.
fs::path scratch_dir() {
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

// Runs mnist_mt with `args`, killing it at the deadline.
Outcome run_cli(const std::vector<std::string>& args, std::chrono::seconds deadline = 120s) {
  const char* exe = std::getenv("MNIST_MT_EXE");
  if (exe == nullptr) throw std::runtime_error("MNIST_MT_EXE is not set");
  const fs::path out = scratch_dir() / "stdout", err = scratch_dir() / "stderr";
  std::vector<char*> argv{const_cast<char*>(exe)};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, STDOUT_FILENO);
    dup2(e, STDERR_FILENO);
    execv(exe, argv.data());
    _exit(127);
  }
  Outcome outcome;
  const auto until = std::chrono::steady_clock::now() + deadline;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      outcome.out = slurp(out);
      outcome.err = slurp(err);
      return outcome;
    }
    std::this_thread::sleep_for(10ms);
  }
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  outcome.out = slurp(out);
  outcome.err = slurp(err);
  return outcome;
}

void write_be32(std::ofstream& f, std::uint32_t v) {
  const char bytes[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  f.write(bytes, 4);
}

// A small MNIST-format data set: noise plus a square placed by the label.
void write_split(const fs::path& dir, const std::string& prefix, std::uint32_t n, unsigned seed) {
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

const fs::path& small_data() {
  static const fs::path dir = [] {
    fs::path d = scratch_dir() / "data";
    fs::create_directories(d);
    write_split(d, "train", 256, 1);
    write_split(d, "t10k", 50, 2);
    return d;
  }();
  return dir;
}

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(Cli, HelpListsTheFlagsButNotTheTestHook) {
  const Outcome o = run_cli({"--help"});
  EXPECT_EQ(o.exit_code, 0);
  for (const char* flag : {"--cpu", "--gpus", "--mode", "--epochs", "--batch-size", "--lr", "--momentum",
                           "--weight-decay", "--seed", "--bucket-mb", "--data", "--save", "--load", "--metrics"}) {
    EXPECT_NE(o.out.find(flag), std::string::npos) << flag;
  }
  EXPECT_EQ(o.out.find("--inject-fault"), std::string::npos);
}

TEST(Cli, BadValuesExit2WithOneLineNamingTheFlag) {
  const std::string data = small_data().string();
  struct Case {
    std::vector<std::string> args;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {{"--gpus", "0,0"}, "--gpus"},
      {{"--gpus", "4096"}, "--gpus"},
      {{"--gpus", ""}, "--gpus"},
      {{"--gpus", "x"}, "--gpus"},
      {{"--gpus", "1,y"}, "--gpus"},
      {{"--gpus", "-1"}, "--gpus"},
      {{"--gpus", "0"}, "--gpus"},
      {{"--cpu", "0"}, "--cpu"},
      {{"--cpu", "two"}, "--cpu"},
      {{"--batch-size", "0"}, "--batch-size"},
      {{"--lr", "nan"}, "--lr"},
      {{"--lr", "-0.5"}, "--lr"},
      {{"--epochs", "-1"}, "--epochs"},
      {{"--mode", "fast"}, "--mode"},
      {{"--momentum", "-1"}, "--momentum"},
      {{"--bucket-mb", "0"}, "--bucket-mb"},
      {{"--cpu", "1", "--gpus", "0"}, "--gpus"},
      {{"--load", (scratch_dir() / "missing.safetensors").string()}, "missing.safetensors"},
      {{"--data", (scratch_dir() / "no-such-dir").string()}, "no-such-dir"},
      {{"--inject-fault", "1"}, "--inject-fault"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    if (c.args[0] != "--data") args.insert(args.end(), {"--data", data});
    if (c.args[0] != "--cpu" && c.args[0] != "--gpus" && c.args.size() == 2) args.insert(args.end(), {"--cpu", "1"});
    const Outcome o = run_cli(args, 60s);
    SCOPED_TRACE(c.args[0] + " " + c.args.back() + ": " + o.err);
    EXPECT_EQ(o.exit_code, 2);
    EXPECT_EQ(count_lines(o.err), 1);
    EXPECT_EQ(o.err.rfind("mnist_mt: error: ", 0), 0u);
    EXPECT_NE(o.err.find(c.flag), std::string::npos);
  }
}

TEST(Cli, TrainsOnASmallDataSetAndWritesMetricsAndACheckpoint) {
  const fs::path metrics = scratch_dir() / "metrics.json";
  const fs::path checkpoint = scratch_dir() / "model.safetensors";
  const Outcome o =
      run_cli({"--cpu", "2", "--batch-size", "8", "--epochs", "2", "--max-steps", "5", "--lr", "0.01", "--momentum",
               "0.9", "--data", small_data().string(), "--metrics", metrics.string(), "--save", checkpoint.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(o.err.empty()) << o.err;
  EXPECT_NE(o.out.find("epoch 2: train loss"), std::string::npos) << o.out;
  const std::string lines = slurp(metrics);
  EXPECT_EQ(count_lines(lines), 2);
  for (const char* key :
       {"\"epoch\":", "\"train_loss\":", "\"test_loss\":", "\"test_accuracy\":", "\"images_per_s\":", "\"seconds\":",
        "\"phase_seconds\":", "\"data_wait\":", "\"forward\":", "\"backward\":", "\"comm_wait\":", "\"optimizer\":"}) {
    EXPECT_NE(lines.find(key), std::string::npos) << key;
  }
  EXPECT_TRUE(fs::exists(checkpoint));

  // The checkpoint resumes, in the DataParallel mode too; --epochs counts the run's total.
  const Outcome resumed = run_cli({"--cpu", "2", "--mode", "dp", "--batch-size", "8", "--epochs", "3", "--max-steps",
                                   "5", "--data", small_data().string(), "--load", checkpoint.string()});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("epoch 3: train loss"), std::string::npos) << resumed.out;
}

TEST(Cli, AnInjectedFaultExits3NamingTheRankAndStepWithinSeconds) {
  for (const char* mode : {"ddp", "dp"}) {
    const auto start = std::chrono::steady_clock::now();
    const Outcome o = run_cli({"--cpu", "3", "--mode", mode, "--batch-size", "8", "--epochs", "1", "--data",
                               small_data().string(), "--inject-fault", "2:4"},
                              60s);
    SCOPED_TRACE(mode);
    EXPECT_EQ(o.exit_code, 3);
    EXPECT_EQ(o.err, "mnist_mt: error: rank 2 failed at step 4: injected fault\n");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  }
}

}  // namespace
