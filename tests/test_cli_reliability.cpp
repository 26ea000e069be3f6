// The executable under signals, stalls and a full disk: the first SIGINT/SIGTERM saves
// where the run stands and exits 130/143, and the same command with --load finishes it
// with the uninterrupted run's bytes, on one rank as on two; a second signal aborts at once leaving no partial
// file; SIGHUP and SIGPIPE do not stop a run; a rank stuck in compute, in a collective or
// waiting for data exits 3 naming the rank, step and phase within the timeout and a few
// seconds; a full disk during a save exits 3 and keeps the previous checkpoint loadable.
// Signals are sent at random moments of the run.
// And what it writes: every flag that writes a file refuses, up front, a device, FIFO,
// socket or directory, an empty path, and a file of another output or of an input;
// writes through a symbolic link; a stop without --save saves where the start line
// says, or says it cannot; a signal during --download ends it at once leaving no
// partial file; a resumed run appends to its metrics; a save removes the temp
// files of killed writers; eval and predict survive a closed stdout.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>

#include <cstring>
#include <functional>
#include <thread>
#include <tuple>

#include "cli_runner.hpp"
#include "loopback.hpp"

namespace {

using namespace cli_test;

constexpr int kEpochs = 6;  // of 16 steps on the small data set

class CliReliability : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir() / testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_);
  }

  std::vector<std::string> args(const fs::path& save) const {
    return {"--cpu", "2", "--batch-size", "8", "--epochs", std::to_string(kEpochs), "--momentum", "0.9",
            "--data", small_data().string(), "--save", save.string()};
  }

  // The uninterrupted run's final checkpoint, and how long its training took.
  const std::string& straight() {
    if (straight_.empty()) {
      const fs::path path = dir_ / "straight.safetensors";
      const auto begin = std::chrono::steady_clock::now();
      const Outcome o = run_cli(args(path));
      took_ = std::chrono::steady_clock::now() - begin;
      EXPECT_EQ(o.exit_code, 0) << o.err;
      straight_ = slurp_binary(path);
    }
    return straight_;
  }

  static std::string slurp_binary(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

  // Starts the run, waits until it has started (the signal watch is up once it prints),
  // then sends `signals` at a random moment of its training, `gap` apart.
  // `scale` shrinks the moment's range, for a retry after a run that ended first.
  Process signalled(const fs::path& save, const std::vector<int>& signals, std::chrono::milliseconds gap = 0ms,
                    double scale = 1) {
    const auto train_time = std::chrono::duration<double>(took_);
    const Process p = spawn(args(save));
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (slurp(p.out).find("mnist_mt: ddp on") == std::string::npos && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(std::uniform_real_distribution<double>(0, 0.8 * scale)(rng_) * train_time);
    for (int s : signals) {
      kill(p.pid, s);
      std::this_thread::sleep_for(gap);
    }
    return p;
  }

  bool temp_files_left() const {
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().starts_with(".")) return true;
    return false;
  }

  fs::path dir_;
  std::string straight_;
  std::chrono::steady_clock::duration took_{};
  std::mt19937 rng_{std::random_device{}()};
};

TEST_F(CliReliability, TheFirstSignalSavesAndTheSameCommandWithLoadFinishesBitwise) {
  const std::string& want = straight();
  for (int signal : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(signal);
    const fs::path path = dir_ / ("stopped" + std::to_string(signal) + ".safetensors");
    Outcome o;
    // A signal after the last step stops nothing: try again earlier.
    for (int attempt = 0; attempt < 6 && (attempt == 0 || o.exit_code == 0); ++attempt)
      o = finish(signalled(path, {signal}, 0ms, 1.0 / (attempt + 1)));
    ASSERT_EQ(o.exit_code, 128 + signal) << o.err;
    EXPECT_NE(o.out.find("checkpoint saved to " + path.string()), std::string::npos) << o.out;
    EXPECT_FALSE(temp_files_left());
    std::vector<std::string> resume = args(path);
    resume.insert(resume.end(), {"--load", path.string()});
    const Outcome r = run_cli(resume);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(slurp_binary(path), want) << o.out;
  }
}

// The command resumed on one rank with the same global batch computes the two ranks'
// shards in turn: the same bytes again.
TEST_F(CliReliability, TheFirstSignalsCheckpointFinishesOnOneRankBitwise) {
  const std::string& want = straight();
  const fs::path path = dir_ / "stopped.safetensors";
  Outcome o;
  for (int attempt = 0; attempt < 6 && (attempt == 0 || o.exit_code == 0); ++attempt)
    o = finish(signalled(path, {SIGTERM}, 0ms, 1.0 / (attempt + 1)));
  ASSERT_EQ(o.exit_code, 128 + SIGTERM) << o.err;
  std::vector<std::string> resume = args(path);
  resume[1] = "1";   // --cpu
  resume[3] = "16";  // --batch-size
  resume.insert(resume.end(), {"--load", path.string()});
  const Outcome r = run_cli(resume);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("resuming a checkpoint of 2 ranks x 8 on 1 rank x 16: its 2 shards of 8 computed 2 a rank"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(slurp_binary(path), want) << o.out;
}

TEST_F(CliReliability, ASecondSignalAbortsAtOnceLeavingNoPartialFile) {
  straight();
  const fs::path path = dir_ / "aborted.safetensors";
  const auto begin = std::chrono::steady_clock::now();
  Outcome o;
  for (int attempt = 0; attempt < 6 && (attempt == 0 || o.exit_code == 0); ++attempt)
    o = finish(signalled(path, {SIGINT, SIGINT}, 1ms, 1.0 / (attempt + 1)), 60s);
  EXPECT_EQ(o.exit_code, 130) << o.err;
  EXPECT_LT(std::chrono::steady_clock::now() - begin, 30s);
  EXPECT_FALSE(temp_files_left());
  if (fs::exists(path)) {  // whatever is there is a whole checkpoint
    std::vector<std::string> resume = args(path);
    resume.insert(resume.end(), {"--load", path.string()});
    EXPECT_EQ(run_cli(resume).exit_code, 0);
  }
}

TEST_F(CliReliability, HangupAndBrokenPipeDoNotStopARun) {
  const std::string& want = straight();
  const fs::path path = dir_ / "hangup.safetensors";
  const Outcome o = finish(signalled(path, {SIGHUP, SIGPIPE}));
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(slurp_binary(path), want);
}

TEST_F(CliReliability, AStalledRankExits3NamingRankStepAndPhaseWithinTheTimeout) {
  const std::vector<std::pair<std::string, std::string>> phases{
      {"data", "data"}, {"compute", "forward"}, {"collective", "collective"}};
  for (const auto& [injected, reported] : phases) {
    const int rank = static_cast<int>(rng_() % 3);
    const int step = static_cast<int>(rng_() % 10);
    const std::string spec = std::to_string(rank) + ":" + std::to_string(step) + ":" + injected;
    SCOPED_TRACE(spec);
    const auto begin = std::chrono::steady_clock::now();
    const Outcome o = run_cli({"--cpu", "3", "--batch-size", "8", "--epochs", "1", "--data", small_data().string(),
                               "--timeout", "1", "--inject-stall", spec},
                              60s);
    EXPECT_EQ(o.exit_code, 3) << o.err;
    EXPECT_EQ(count_lines(o.err), 1) << o.err;
    EXPECT_EQ(o.err.rfind("mnist_mt: error: rank " + std::to_string(rank) + " failed at step " + std::to_string(step) +
                              ": stalled in phase " + reported,
                          0),
              0u)
        << o.err;
    // Timeout 1 s, a 3 s grace for a rank that cannot be released, and the start-up.
    EXPECT_LT(std::chrono::steady_clock::now() - begin, 15s);
  }
}

TEST_F(CliReliability, AFullDiskExits3AndKeepsThePreviousCheckpointLoadable) {
  const fs::path path = dir_ / "model.safetensors";
  const std::vector<std::string> first{"--cpu", "2", "--batch-size", "8", "--epochs", "1", "--max-steps", "3",
                                       "--data", small_data().string(), "--save", path.string()};
  ASSERT_EQ(run_cli(first).exit_code, 0);
  const std::string before = slurp_binary(path);
  std::vector<std::string> second = first;
  second[5] = "2";
  second.insert(second.end(), {"--load", path.string()});
  const Outcome o = finish(spawn(second, {}, 1 << 20), 60s);  // a checkpoint is 4.8 MB
  EXPECT_EQ(o.exit_code, 3) << o.err;
  EXPECT_EQ(count_lines(o.err), 1) << o.err;
  EXPECT_NE(o.err.find(path.string() + ": cannot write"), std::string::npos) << o.err;
  EXPECT_EQ(slurp_binary(path), before);
  EXPECT_FALSE(temp_files_left());
  EXPECT_EQ(run_cli(second).exit_code, 0);  // it loads, and the run goes on with room
}

// A save that fails mid-run because its directory went away (checked before any work,
// so not bad input) is a runtime failure: exit 3, one line naming the file.
TEST_F(CliReliability, ASaveWhoseDirectoryVanishedMidRunExits3) {
  const fs::path gone = dir_ / "gone";
  fs::create_directory(gone);
  const fs::path path = gone / "model.safetensors";
  Process p = spawn({"--cpu", "1", "--batch-size", "8", "--epochs", "1", "--max-steps", "400", "--save-every", "1",
                     "--data", small_data().string(), "--save", path.string()});
  // Each step saves 4.8 MB with an fsync: the run is still going when the first lands.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!fs::exists(path) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(fs::exists(path));
  fs::remove_all(gone);
  const Outcome o = finish(p, 60s);
  EXPECT_EQ(o.exit_code, 3) << o.err;
  EXPECT_EQ(count_lines(o.err), 1) << o.err;
  EXPECT_NE(o.err.find(path.string() + ": cannot create a temp file"), std::string::npos) << o.err;
}

// A batch whose activations alone exceed the memory the process may use is refused
// before the data is read, not killed by the kernel mid-run (the limit set here by
// MNIST_MT_MEMORY_AVAILABLE; MemAvailable or a cgroup's memory.max otherwise).
TEST_F(CliReliability, ABatchBeyondTheAvailableMemoryIsRefusedBeforeTraining) {
  const std::vector<std::string> args{"--cpu", "2", "--batch-size", "8", "--epochs", "1", "--max-steps", "1",
                                      "--data", small_data().string()};
  Outcome o = finish(spawn(args, {"MNIST_MT_MEMORY_AVAILABLE=1000000"}), 60s);
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_EQ(count_lines(o.err), 1) << o.err;
  EXPECT_EQ(o.err.rfind("mnist_mt: error: --batch-size: 8 images a rank on 2 ranks need 6.", 0), 0u) << o.err;
  EXPECT_NE(o.err.find("than the 1.0 MiB available (MNIST_MT_MEMORY_AVAILABLE)"), std::string::npos) << o.err;
  EXPECT_EQ(o.out.find("from"), std::string::npos) << "read the data first: " << o.out;
  o = finish(spawn(args, {"MNIST_MT_MEMORY_AVAILABLE=100000000"}), 60s);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  o = finish(spawn(args, {"MNIST_MT_MEMORY_AVAILABLE=lots"}), 60s);
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_NE(o.err.find("MNIST_MT_MEMORY_AVAILABLE: expected bytes as a whole number, got 'lots'"), std::string::npos)
      << o.err;
}

TEST_F(CliReliability, MetricsAndSummaryReportPeakResidentMemory) {
  const fs::path metrics = dir_ / "metrics.json";
  const Outcome o = run_cli({"--cpu", "2", "--batch-size", "8", "--epochs", "1", "--max-steps", "3", "--data",
                             small_data().string(), "--metrics", metrics.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("peak RSS "), std::string::npos) << o.out;
  const std::string line = slurp(metrics);
  const std::size_t at = line.find("\"peak_rss_bytes\":");
  ASSERT_NE(at, std::string::npos) << line;
  // More than the 4.8 MB of parameters the process certainly holds.
  EXPECT_GT(std::stoull(line.substr(at + 17)), 4'800'000u) << line;
}

// --- What mnist_mt writes: only its own regular files ---

// The files of one case, in a directory of their own.
class CliOutputs : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir() / testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_);
  }

  fs::path fresh_dir(const std::string& name) const {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    return d;
  }

  // A short training run's arguments, then `extra`.
  static std::vector<std::string> train(const std::vector<std::string>& extra) {
    std::vector<std::string> a{"--cpu", "1", "--batch-size", "8", "--epochs", "1", "--max-steps", "2",
                               "--data", small_data().string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  static std::vector<std::string> eval(const fs::path& checkpoint, const std::vector<std::string>& extra) {
    std::vector<std::string> a{"eval", "--cpu", "1", "--batch-size", "10", "--load", checkpoint.string(),
                               "--data", small_data().string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  // A checkpoint of a short run, copied to `path`.
  static void checkpoint_at(const fs::path& path) {
    static const fs::path made = [] {
      const fs::path p = scratch_dir() / "outputs-checkpoint.safetensors";
      const Outcome o = run_cli(train({"--save", p.string()}));
      EXPECT_EQ(o.exit_code, 0) << o.err;
      return p;
    }();
    fs::copy_file(made, path, fs::copy_options::overwrite_existing);
  }

  static bool hidden_files(const fs::path& dir) {
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.path().filename().string().starts_with(".")) return true;
    return false;
  }

  // One line on stderr naming the flag and the path, exit 2, within 5 s, nothing trained.
  static void expect_refused(const Outcome& o, std::chrono::steady_clock::duration took, const std::string& flag,
                             const std::string& path) {
    EXPECT_EQ(o.exit_code, 2) << o.err;
    EXPECT_EQ(count_lines(o.err), 1) << o.err;
    EXPECT_EQ(o.err.rfind("mnist_mt: error: " + flag + ": ", 0), 0u) << o.err;
    EXPECT_NE(o.err.find(path), std::string::npos) << o.err;
    EXPECT_LT(took, 5s);
    EXPECT_EQ(o.out.find("epoch 1"), std::string::npos) << "trained before refusing";
  }

  static Outcome timed(const std::vector<std::string>& args, std::chrono::steady_clock::duration& took,
                       const std::vector<std::string>& env = {}) {
    const auto begin = std::chrono::steady_clock::now();
    const Outcome o = run_cli(args, 30s, env);
    took = std::chrono::steady_clock::now() - begin;
    return o;
  }

  fs::path dir_;
};

// What a path is: its kind, inode and device number, to see that nothing replaced it.
struct Node {
  mode_t type = 0;
  ino_t inode = 0;
  dev_t device = 0;
  bool operator==(const Node&) const = default;
};

Node node_at(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return {};
  return {static_cast<mode_t>(st.st_mode & S_IFMT), st.st_ino, st.st_rdev};
}

// Bound under a short name, then moved: a socket's path must fit in 108 bytes.
void make_socket(const fs::path& path) {
  const fs::path bound = scratch_dir() / "socket";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(bound.string().size(), sizeof address.sun_path);
  std::memcpy(address.sun_path, bound.c_str(), bound.string().size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  ::close(fd);
  fs::rename(bound, path);
}

// Each kind of file that is not a regular one; device nodes only where we may make them
// (root). The block device's number has no driver, so that nothing can open it.
std::vector<std::pair<std::string, std::function<void(const fs::path&)>>> non_regular_kinds() {
  std::vector<std::pair<std::string, std::function<void(const fs::path&)>>> kinds{
      {"FIFO", [](const fs::path& p) { ASSERT_EQ(::mkfifo(p.c_str(), 0666), 0); }},
      {"socket", [](const fs::path& p) { make_socket(p); }},
      {"directory", [](const fs::path& p) { fs::create_directories(p / "inside"); }},
  };
  if (::geteuid() == 0) {
    kinds.push_back({"character device", [](const fs::path& p) {
                       ASSERT_EQ(::mknod(p.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);  // /dev/null's
                     }});
    kinds.push_back({"block device", [](const fs::path& p) {
                       ASSERT_EQ(::mknod(p.c_str(), S_IFBLK | 0666, makedev(240, 0)), 0);
                     }});
  }
  return kinds;
}

// Without a network, whatever the build does: proxies on a closed port.
std::vector<std::string> offline() {
  return {"http_proxy=http://127.0.0.1:1", "https_proxy=http://127.0.0.1:1", "HTTPS_PROXY=http://127.0.0.1:1",
          "ALL_PROXY=http://127.0.0.1:1", "no_proxy=", "NO_PROXY="};
}

TEST_F(CliOutputs, EveryFlagThatWritesAFileRefusesADeviceFifoSocketOrDirectoryAndLeavesItAsItWas) {
  const fs::path checkpoint = dir_ / "model.safetensors";
  checkpoint_at(checkpoint);
  struct Form {
    std::string flag;
    std::string name;  // of the node in the way
    std::function<std::vector<std::string>(const fs::path& dir)> args;
    bool through_link = false;  // the flag names a symbolic link to the node
  };
  const std::vector<Form> forms{
      {"--save", "model.safetensors", [](const fs::path& d) { return train({"--save", (d / "model.safetensors").string()}); }},
      {"--metrics", "metrics.json", [](const fs::path& d) { return train({"--metrics", (d / "metrics.json").string()}); }},
      {"--trace", "trace.json", [](const fs::path& d) { return train({"--trace", (d / "trace.json").string()}); }},
      {"--keep", "model.step-2.safetensors",
       [](const fs::path& d) { return train({"--save", (d / "model.safetensors").string(), "--keep", "2"}); }},
      {"--json", "eval.json",
       [&](const fs::path& d) { return eval(checkpoint, {"--json", (d / "eval.json").string()}); }},
      {"--download", "train-images-idx3-ubyte.gz",
       [](const fs::path& d) {
         return std::vector<std::string>{"--download", "--data", d.string(), "--mirror", "http://127.0.0.1:1/",
                                         "--cpu", "1"};
       }},
      {"--metrics", "node", [](const fs::path& d) { return train({"--metrics", (d / "metrics.json").string()}); },
       true},
  };
  for (const Form& form : forms) {
    for (const auto& [kind, make] : non_regular_kinds()) {
      SCOPED_TRACE(form.flag + (form.through_link ? " through a link" : "") + ", " + kind);
      const fs::path d = fresh_dir(form.name + "-" + std::to_string(&form - forms.data()) + "-" + kind);
      const fs::path node = d / form.name;
      make(node);
      if (form.through_link) fs::create_symlink(node.filename(), d / "metrics.json");
      const Node before = node_at(node);
      std::chrono::steady_clock::duration took{};
      const Outcome o = timed(form.args(d), took, offline());
      expect_refused(o, took, form.flag, (form.through_link ? d / "metrics.json" : node).string());
      EXPECT_NE(o.err.find(kind), std::string::npos) << o.err;
      EXPECT_EQ(node_at(node), before);
      if (form.through_link) {
        EXPECT_TRUE(fs::is_symlink(d / "metrics.json"));
      }
      EXPECT_FALSE(hidden_files(d));
    }
  }
}

TEST_F(CliOutputs, ASymbolicLinkIsWrittenThroughAndStays) {
  const fs::path checkpoint = dir_ / "model.safetensors";
  checkpoint_at(checkpoint);
  struct Form {
    std::string flag;
    std::function<std::vector<std::string>(const fs::path& link)> args;
  };
  const std::vector<Form> forms{
      {"--save", [](const fs::path& l) { return train({"--save", l.string()}); }},
      {"--keep", [](const fs::path& l) { return train({"--save", l.string(), "--keep", "2"}); }},
      {"--metrics", [](const fs::path& l) { return train({"--metrics", l.string()}); }},
      {"--trace", [](const fs::path& l) { return train({"--trace", l.string()}); }},
      {"--json", [&](const fs::path& l) { return eval(checkpoint, {"--json", l.string()}); }},
  };
  for (const Form& form : forms) {
    for (const bool target_exists : {true, false}) {
      SCOPED_TRACE(form.flag + (target_exists ? ", to a file" : ", to no file yet"));
      const fs::path d = fresh_dir(form.flag.substr(2) + (target_exists ? "-file" : "-none"));
      fs::create_directories(d / "real");
      const fs::path target = d / "real" / "out.safetensors";
      if (target_exists) std::ofstream(target) << "old";
      const fs::path link = d / "out.safetensors";
      fs::create_symlink("real/out.safetensors", link);
      const Outcome o = run_cli(form.args(link));
      ASSERT_EQ(o.exit_code, 0) << o.err;
      EXPECT_TRUE(fs::is_symlink(link));
      EXPECT_EQ(fs::read_symlink(link), "real/out.safetensors");
      ASSERT_TRUE(fs::is_regular_file(target));
      EXPECT_GT(fs::file_size(target), 3u);
      EXPECT_FALSE(hidden_files(d));
    }
  }
}

TEST_F(CliOutputs, AnOutputThatIsAnInputOrAnotherOutputIsRefusedAndLeftAsItWas) {
  const fs::path data = make_data("outputs-data", 256, 50, 1);  // its own: the cases aim at it
  struct Case {
    std::string flag;
    std::string path;                            // the one the error names
    std::vector<std::string> args;
    fs::path kept;                               // a file that must keep its bytes, or empty
  };
  const fs::path ck = dir_ / "model.safetensors";
  checkpoint_at(ck);
  const fs::path link = dir_ / "link.json", hard = dir_ / "hard.json", fresh = dir_ / "fresh.json";
  fs::create_symlink(ck.filename(), link);
  fs::create_hard_link(ck, hard);
  const auto on_data = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> a = train(extra);
    a[9] = data.string();  // --data
    return a;
  };
  const std::string labels = (data / "train-labels-idx1-ubyte").string();
  const std::string test_images = (data / "t10k-images-idx3-ubyte").string();
  const std::vector<Case> cases{
      {"--metrics", ck.string(), train({"--metrics", ck.string(), "--load", ck.string()}), ck},
      {"--trace", ck.string(), train({"--trace", ck.string(), "--load", ck.string()}), ck},
      {"--metrics", link.string(), train({"--metrics", link.string(), "--load", ck.string()}), ck},
      {"--metrics", hard.string(), train({"--metrics", hard.string(), "--load", ck.string()}), ck},
      {"--metrics", fresh.string(), train({"--save", fresh.string(), "--metrics", fresh.string()}), {}},
      {"--trace", (dir_ / "." / "fresh.json").string(),
       train({"--metrics", fresh.string(), "--trace", (dir_ / "." / "fresh.json").string()}), {}},
      {"--metrics", (dir_ / "model.step-2.safetensors").string(),
       train({"--save", ck.string(), "--keep", "2", "--metrics", (dir_ / "model.step-2.safetensors").string()}), ck},
      {"--metrics", labels, on_data({"--metrics", labels}), labels},
      {"--save", test_images, on_data({"--save", test_images}), test_images},
      {"--json", ck.string(), eval(ck, {"--json", ck.string()}), ck},
      {"--json", labels, [&] {
         std::vector<std::string> a = eval(ck, {"--json", labels});
         a[8] = data.string();
         return a;
       }(), labels},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag + " " + c.path);
    const std::string before = c.kept.empty() ? "" : slurp(c.kept);
    std::chrono::steady_clock::duration took{};
    const Outcome o = timed(c.args, took);
    expect_refused(o, took, c.flag, c.path);
    if (!c.kept.empty()) {
      EXPECT_EQ(slurp(c.kept), before);
    }
    EXPECT_FALSE(fs::exists(fresh));
    EXPECT_FALSE(hidden_files(dir_));
  }
  // Data found through $MNIST_MT_DATA, not --data, is as much an input.
  {
    SCOPED_TRACE("MNIST_MT_DATA");
    const std::string before = slurp(labels);
    std::vector<std::string> args = train({"--metrics", labels});
    args.erase(args.begin() + 8, args.begin() + 10);  // --data
    std::chrono::steady_clock::duration took{};
    const Outcome o = timed(args, took, {"MNIST_MT_DATA=" + data.string()});
    expect_refused(o, took, "--metrics", labels);
    EXPECT_EQ(slurp(labels), before);
  }
  // The checkpoint a run continues is the one output that may be an input.
  std::vector<std::string> resume = train({"--save", ck.string(), "--load", ck.string()});
  resume[5] = "2";  // --epochs
  const Outcome o = run_cli(resume);
  EXPECT_EQ(o.exit_code, 0) << o.err;
}

TEST_F(CliOutputs, AnEmptyPathIsRefusedBeforeAnyWork) {
  const fs::path ck = dir_ / "model.safetensors";
  checkpoint_at(ck);
  for (const auto& [flag, args] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"--save", train({"--save", ""})},
           {"--metrics", train({"--metrics", ""})},
           {"--trace", train({"--trace", ""})},
           {"--json", eval(ck, {"--json", ""})}}) {
    SCOPED_TRACE(flag);
    std::chrono::steady_clock::duration took{};
    const Outcome o = timed(args, took);
    expect_refused(o, took, flag, "''");
    EXPECT_EQ(o.out, "");
  }
}

// `command` with the environment entries, in the directory `cwd`; as the user nobody
// when we are root, so that permissions hold.
Process spawn_in(const fs::path& cwd, const std::vector<std::string>& args, const std::vector<std::string>& env,
                 bool as_nobody) {
  std::vector<std::string> command;
  if (as_nobody && ::geteuid() == 0)
    command = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  command.insert(command.end(), {"env", "-C", cwd.string(), fs::absolute(exe_path()).string()});
  command.insert(command.end(), args.begin(), args.end());
  return spawn_command(command, env);
}

// SIGINT once the run has said how it starts.
Outcome interrupt_after_start(const Process& p) {
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (slurp(p.out).find("mnist_mt: ddp on") == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(200ms);
  kill(p.pid, SIGINT);
  return finish(p, 60s);
}

TEST_F(CliOutputs, WithoutSaveAStopSavesWhereTheStartLineSaysOrSaysItCannotAndExits130) {
  const std::string kNoCheckpoint =
      "mnist_mt: SIGINT: stopping after the step in flight, without a checkpoint (nowhere to save one); again to "
      "abort\n";
  const std::vector<std::string> args{"--cpu", "1", "--batch-size", "8", "--epochs", "100000", "--data",
                                      small_data().string()};
  // The working directory's name is taken by a FIFO: the temp directory instead.
  const fs::path cwd = fresh_dir("cwd"), temp = fresh_dir("temp");
  ASSERT_EQ(::mkfifo((cwd / "mnist_mt-interrupted.safetensors").c_str(), 0666), 0);
  const Node fifo = node_at(cwd / "mnist_mt-interrupted.safetensors");
  const fs::path saved = temp / ("mnist_mt-interrupted-" + std::to_string(::geteuid()) + ".safetensors");
  Outcome o = interrupt_after_start(spawn_in(cwd, args, {"TMPDIR=" + temp.string()}, false));
  EXPECT_EQ(o.exit_code, 130) << o.err;
  EXPECT_EQ(o.err, "mnist_mt: SIGINT: stopping after the step in flight to save a checkpoint; again to abort\n");
  EXPECT_NE(o.out.find("test images; SIGINT/SIGTERM saves to " + saved.string()), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("checkpoint saved to " + saved.string()), std::string::npos) << o.out;
  EXPECT_EQ(run_cli(eval(saved, {})).exit_code, 0);
  EXPECT_EQ(node_at(cwd / "mnist_mt-interrupted.safetensors"), fifo);

  // No temp directory either: the start line says so, and the stop is no error.
  o = interrupt_after_start(spawn_in(cwd, args, {"TMPDIR=" + (dir_ / "missing").string()}, false));
  EXPECT_EQ(o.exit_code, 130) << o.err;
  EXPECT_NE(o.out.find("test images; no checkpoint on SIGINT/SIGTERM without --save"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("no checkpoint saved"), std::string::npos) << o.out;
  EXPECT_EQ(o.err, kNoCheckpoint) << "the signal's message promised a save";
  EXPECT_EQ(node_at(cwd / "mnist_mt-interrupted.safetensors"), fifo);

  // A user who may write neither directory.
  const fs::path closed = fresh_dir("closed"), closed_temp = fresh_dir("closed-temp");
  fs::permissions(closed, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                              fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(closed_temp, fs::status(closed).permissions());
  o = interrupt_after_start(spawn_in(closed, args, {"TMPDIR=" + closed_temp.string()}, true));
  EXPECT_EQ(o.exit_code, 130) << o.err;
  EXPECT_NE(o.out.find("no checkpoint on SIGINT/SIGTERM without --save"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("not writable"), std::string::npos) << o.out;
  EXPECT_EQ(o.err, kNoCheckpoint);
  EXPECT_TRUE(fs::is_empty(closed));
  EXPECT_TRUE(fs::is_empty(closed_temp));
}

TEST_F(CliOutputs, AnOutputInADirectoryTheUserMayNotWriteIsRefusedUpFront) {
  const fs::path ck = dir_ / "model.safetensors";
  checkpoint_at(ck);
  fs::permissions(ck, fs::perms::others_read, fs::perm_options::add);
  const fs::path closed = fresh_dir("closed");
  fs::permissions(closed, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                              fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  for (const auto& [flag, args] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"--save", train({"--save", (closed / "model.safetensors").string()})},
           {"--metrics", train({"--metrics", (closed / "metrics.json").string()})},
           {"--json", eval(ck, {"--json", (closed / "eval.json").string()})}}) {
    SCOPED_TRACE(flag);
    const auto begin = std::chrono::steady_clock::now();
    const Outcome o = finish(spawn_in(dir_, args, {}, true), 30s);
    expect_refused(o, std::chrono::steady_clock::now() - begin, flag, closed.string());
    EXPECT_NE(o.err.find("not writable"), std::string::npos) << o.err;
  }
  EXPECT_TRUE(fs::is_empty(closed));
}

// The mirror sends 2 bytes a second: a SIGINT while a file comes ends the program at
// once, exit 130, and nothing of the file is left. Training says why; eval and predict
// end as the signal ends any program.
TEST_F(CliOutputs, ASignalDuringADownloadEndsItAtOnceLeavingNoPartialFile) {
  const fs::path ck = dir_ / "model.safetensors";
  checkpoint_at(ck);
  const fs::path served = fresh_dir("served");
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"})
    std::ofstream(served / (std::string(name) + ".gz")) << std::string(1000, 'x');
  const LoopbackServer server(served, 60);
  std::vector<std::string> env = offline();
  env.insert(env.end(), {"no_proxy=127.0.0.1", "NO_PROXY=127.0.0.1"});  // the mirror is reached
  const std::vector<std::vector<std::string>> commands{
      {}, {"eval", "--load", ck.string()}, {"predict", "--load", ck.string(), "--index", "0"}};
  for (const std::vector<std::string>& command : commands) {
    SCOPED_TRACE(command.empty() ? "train" : command[0]);
    const fs::path data = fresh_dir("download-" + (command.empty() ? "train" : command[0]));
    std::vector<std::string> args = command;
    args.insert(args.end(), {"--cpu", "1", "--download", "--data", data.string(), "--mirror", server.base() + "drip/"});
    const Process p = spawn(args, env);
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (slurp(p.out).find("(--download)") == std::string::npos && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(1s);  // the transfer under way
    const auto sent = std::chrono::steady_clock::now();
    kill(p.pid, SIGINT);
    const Outcome o = finish(p, 60s);
    EXPECT_EQ(o.exit_code, 130) << o.err;
    EXPECT_LT(std::chrono::steady_clock::now() - sent, 3s);
    EXPECT_TRUE(fs::is_empty(data));
    if (command.empty()) {
      EXPECT_EQ(o.err, "mnist_mt: SIGINT: ending before training starts (nothing to save yet)\nmnist_mt: error: " +
                           (data / "train-images-idx3-ubyte.gz").string() +
                           ": download abandoned (SIGINT); no partial file is left\n");
    }
  }
}

// A --metrics file that begins with `earlier`, then holds epochs 1..`epochs` once each,
// in order.
void expect_epochs_once(const std::string& text, const std::string& earlier, int epochs) {
  EXPECT_EQ(text.rfind(earlier, 0), 0u) << text;
  std::istringstream lines(text);
  int epoch = 0;
  for (std::string line; std::getline(lines, line);)
    EXPECT_EQ(line.rfind("{\"epoch\":" + std::to_string(++epoch) + ",", 0), 0u) << line;
  EXPECT_EQ(epoch, epochs);
}

// The program's own advice after a stop (the same command with --load) keeps the
// metrics of the epochs before it; a new run starts the file anew.
TEST_F(CliOutputs, AResumedRunAppendsToItsMetricsAndANewRunReplacesThem) {
  const fs::path ck = dir_ / "model.safetensors", metrics = dir_ / "metrics.json";
  const int epochs = 40;
  const std::vector<std::string> args{"--cpu", "1", "--batch-size", "8", "--epochs", std::to_string(epochs),
                                      "--max-steps", "4", "--data", small_data().string(), "--save", ck.string(),
                                      "--metrics", metrics.string()};
  Outcome o;
  for (int attempt = 0; attempt < 5 && (attempt == 0 || o.exit_code == 0); ++attempt) {
    std::error_code ignored;
    fs::remove(metrics, ignored);
    const Process p = spawn(args);
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (count_lines(slurp(metrics)) < 1 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    kill(p.pid, SIGINT);
    o = finish(p, 60s);
  }
  ASSERT_EQ(o.exit_code, 130) << o.err;
  const std::string before = slurp(metrics);
  ASSERT_GE(count_lines(before), 1);
  std::vector<std::string> resume = args;
  resume.insert(resume.end(), {"--load", ck.string()});
  ASSERT_EQ(run_cli(resume).exit_code, 0);
  expect_epochs_once(slurp(metrics), before, epochs);

  std::vector<std::string> again = args;
  again[5] = "1";
  ASSERT_EQ(run_cli(again).exit_code, 0);
  EXPECT_EQ(count_lines(slurp(metrics)), 1);
  EXPECT_FALSE(hidden_files(dir_));
}

// A resume from an earlier checkpoint trains its later epochs again: their old lines go,
// so that the file still holds every epoch once, in order.
TEST_F(CliOutputs, AResumeFromAnEarlierCheckpointRewritesTheLaterEpochsOnce) {
  const fs::path ck = dir_ / "model.safetensors", first = dir_ / "epoch1.safetensors", metrics = dir_ / "m.json";
  const auto run = [&](int epochs, const std::vector<std::string>& extra) {
    std::vector<std::string> a{"--cpu", "1", "--batch-size", "8", "--epochs", std::to_string(epochs), "--max-steps",
                               "2", "--data", small_data().string(), "--metrics", metrics.string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_cli(a).exit_code;
  };
  ASSERT_EQ(run(1, {"--save", ck.string()}), 0);
  fs::copy_file(ck, first);
  const std::string epoch1 = slurp(metrics);
  ASSERT_EQ(run(3, {"--save", ck.string(), "--load", ck.string()}), 0);
  ASSERT_EQ(count_lines(slurp(metrics)), 3);
  ASSERT_EQ(run(3, {"--load", first.string()}), 0);
  expect_epochs_once(slurp(metrics), epoch1, 3);
}

// The same layout resumed in the other mode adds its sums otherwise, and says so.
TEST_F(CliOutputs, AResumeInTheOtherModeSaysItIsNotBitForBit) {
  const fs::path ddp = dir_ / "ddp.safetensors", dp = dir_ / "dp.safetensors";
  const auto args = [&](int epochs, const std::vector<std::string>& extra) {
    std::vector<std::string> a{"--cpu", "2", "--batch-size", "8", "--epochs", std::to_string(epochs), "--max-steps",
                               "2", "--data", small_data().string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  ASSERT_EQ(run_cli(args(1, {"--save", ddp.string()})).exit_code, 0);
  ASSERT_EQ(run_cli(args(1, {"--save", dp.string(), "--mode", "dp"})).exit_code, 0);
  for (const auto& [load, mode, says] :
       std::vector<std::tuple<fs::path, std::string, std::string>>{{ddp, "dp", "(not bit for bit: --mode dp)"},
                                                                   {dp, "ddp", "(not bit for bit: its sums were not added shard by shard)"},
                                                                   {ddp, "ddp", ""}, {dp, "dp", ""}}) {
    SCOPED_TRACE(load.string() + " in " + mode);
    const Outcome o = run_cli(args(2, {"--load", load.string(), "--mode", mode}));
    ASSERT_EQ(o.exit_code, 0) << o.err;
    if (says.empty())
      EXPECT_EQ(o.out.find("not bit for bit"), std::string::npos) << o.out;
    else
      EXPECT_NE(o.out.find(says), std::string::npos) << o.out;
  }
}

// A checkpoint whose step count is past the end of the run's one-cycle schedule is
// refused at load, naming why; one within it resumes.
TEST_F(CliOutputs, ACheckpointPastTheRunsScheduleIsRefusedAtLoad) {
  const auto args = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> a{"--cpu", "1", "--batch-size", "8", "--data", small_data().string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const fs::path cycle = dir_ / "cycle.safetensors";
  ASSERT_EQ(run_cli(args({"--epochs", "2", "--max-steps", "4", "--lr-schedule", "onecycle", "--save", cycle.string()}))
                .exit_code,
            0);
  const Outcome o =
      run_cli(args({"--epochs", "3", "--max-steps", "2", "--lr-schedule", "onecycle", "--load", cycle.string()}));
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_EQ(count_lines(o.err), 1) << o.err;
  EXPECT_NE(o.err.find("its step count, 8, is past the end of this run's one-cycle schedule of 6 steps"),
            std::string::npos)
      << o.err;
  EXPECT_EQ(run_cli(args({"--epochs", "3", "--max-steps", "4", "--lr-schedule", "onecycle", "--load", cycle.string()}))
                .exit_code,
            0);
}

// Temp files named for a writer that is gone (here: a child that exited) go at the
// next save to their file; those of a live writer stay.
TEST_F(CliOutputs, ASaveRemovesTheTempFilesOfKilledWritersButNotOfLiveOnes) {
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  const std::string dead = std::to_string(gone), live = std::to_string(::getpid());
  const std::vector<std::string> dead_files{".model.safetensors.tmp-" + dead + "-0",
                                            ".model.step-9.safetensors.tmp-" + dead + "-3",
                                            ".metrics.json.tmp-" + dead + "-1", ".eval.json.tmp-" + dead + "-0"};
  const std::vector<std::string> live_files{".model.safetensors.tmp-" + live + "-0", ".other.json.tmp-" + dead + "-0"};
  for (const auto& name : dead_files) std::ofstream(dir_ / name) << "partial";
  for (const auto& name : live_files) std::ofstream(dir_ / name) << "partial";
  const fs::path ck = dir_ / "model.safetensors";
  ASSERT_EQ(run_cli(train({"--save", ck.string(), "--keep", "2", "--metrics", (dir_ / "metrics.json").string()}))
                .exit_code,
            0);
  ASSERT_EQ(run_cli(eval(ck, {"--json", (dir_ / "eval.json").string()})).exit_code, 0);
  for (const auto& name : dead_files) EXPECT_FALSE(fs::exists(dir_ / name)) << name;
  for (const auto& name : live_files) EXPECT_TRUE(fs::exists(dir_ / name)) << name;
}

// mnist_mt with stdout set up by `setup` in the child (a pipe nobody reads, /dev/full).
Outcome run_with_stdout(const std::vector<std::string>& args, const std::function<void()>& setup) {
  static int runs = 0;
  const fs::path err = scratch_dir() / ("stdout_test_err" + std::to_string(runs++));
  std::vector<std::string> command{exe_path()};
  command.insert(command.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : command) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setup();
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(e, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return finish(Process{pid, "/dev/null", err}, 60s);
}

TEST_F(CliOutputs, EvalAndPredictSurviveAClosedStdoutAndStillWriteTheirFiles) {
  const fs::path ck = dir_ / "model.safetensors";
  checkpoint_at(ck);
  const auto closed_pipe = [] {  // as `| head -1` leaves it: the reader gone
    int fds[2];
    if (pipe(fds) != 0) _exit(126);
    close(fds[0]);
    dup2(fds[1], STDOUT_FILENO);
  };
  const fs::path json = dir_ / "eval.json";
  Outcome o = run_with_stdout(eval(ck, {"--json", json.string()}), closed_pipe);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(slurp(json).rfind("{\"checkpoint\":", 0), 0u);
  EXPECT_EQ(count_lines(o.err), 1) << o.err;
  EXPECT_NE(o.err.find("standard output"), std::string::npos) << o.err;
  o = run_with_stdout({"predict", "--cpu", "1", "--load", ck.string(), "--data", small_data().string(), "--index", "0",
                       "--index", "1"},
                      closed_pipe);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(count_lines(o.err), 1) << o.err;

  // Any other write error lost the results: reported, exit 3, the file written still.
  fs::remove(json);
  o = run_with_stdout(eval(ck, {"--json", json.string()}), [] {
    const int full = open("/dev/full", O_WRONLY);
    dup2(full, STDOUT_FILENO);
  });
  EXPECT_EQ(o.exit_code, 3) << o.err;
  EXPECT_EQ(o.err, "mnist_mt: error: standard output: cannot write the results\n");
  EXPECT_EQ(slurp(json).rfind("{\"checkpoint\":", 0), 0u);
}

// Training too: its checkpoint written, then a closed pipe noted (exit 0) and any other
// write error on stdout reported (exit 3).
TEST_F(CliOutputs, TrainingReportsAStdoutWriteErrorAfterWritingItsFiles) {
  const fs::path ck = dir_ / "trained.safetensors";
  Outcome o = run_with_stdout(train({"--save", ck.string()}), [] {
    int fds[2];
    if (pipe(fds) != 0) _exit(126);
    close(fds[0]);
    dup2(fds[1], STDOUT_FILENO);
  });
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(count_lines(o.err), 1) << o.err;
  EXPECT_NE(o.err.find("standard output"), std::string::npos) << o.err;
  EXPECT_TRUE(fs::exists(ck));
  fs::remove(ck);
  o = run_with_stdout(train({"--save", ck.string()}), [] {
    const int full = open("/dev/full", O_WRONLY);
    dup2(full, STDOUT_FILENO);
  });
  EXPECT_EQ(o.exit_code, 3) << o.err;
  EXPECT_EQ(o.err, "mnist_mt: error: standard output: cannot write the results\n");
  EXPECT_TRUE(fs::exists(ck));
}

TEST_F(CliOutputs, AFifoGivenAsAnInputIsRefusedWithoutWaitingForAWriter) {
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  const fs::path ck = dir_ / "model.safetensors";
  checkpoint_at(ck);
  for (const auto& [named, args] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"--load", train({"--load", fifo.string()})},
           {"--load", eval(fifo, {})},
           {fifo.string(), {"predict", "--cpu", "1", "--load", ck.string(), fifo.string()}}}) {
    SCOPED_TRACE(args[0] + " " + named);
    const auto begin = std::chrono::steady_clock::now();
    const Outcome o = run_cli(args, 30s);
    EXPECT_LT(std::chrono::steady_clock::now() - begin, 5s);
    EXPECT_EQ(o.exit_code, 2) << o.err;
    EXPECT_EQ(count_lines(o.err), 1) << o.err;
    EXPECT_NE(o.err.find(named), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("a FIFO, not a regular file"), std::string::npos) << o.err;
  }
}

}  // namespace
