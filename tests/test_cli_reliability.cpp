// The executable under signals, stalls and a full disk: the first SIGINT/SIGTERM saves
// where the run stands and exits 130/143, and the same command with --load finishes it
// with the uninterrupted run's bytes, on one rank as on two; a second signal aborts at once leaving no partial
// file; SIGHUP and SIGPIPE do not stop a run; a rank stuck in compute, in a collective or
// waiting for data exits 3 naming the rank, step and phase within the timeout and a few
// seconds; a full disk during a save exits 3 and keeps the previous checkpoint loadable.
// Signals are sent at random moments of the run.
#include <gtest/gtest.h>

#include "cli_runner.hpp"

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

}  // namespace
