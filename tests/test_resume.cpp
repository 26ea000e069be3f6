// Never lose work, never hang, in process on the CPU backend: a run resumed from any
// mid-epoch checkpoint (by --save-every or by a stop request at a random moment) ends
// with the uninterrupted run's weights bit for bit; --keep keeps the last N; an abort
// request and a stalled rank release every rank; a diverged run stops and keeps the
// last good checkpoint; a first signal before training starts ends the run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/numbered_checkpoints.hpp"
#include "train_fixture.hpp"

namespace mnist_mt {
namespace {

using namespace testing_fixture;

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class ResumeTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mnist_mt_resume_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Two epochs of 20 steps, momentum on, so that the checkpoint's momentum matters too.
  static TrainConfig two_epochs(Mode mode) {
    TrainConfig c = config_for(2, 8);
    c.mode = mode;
    c.optimizer.momentum = 0.9f;
    c.epochs = 2;
    return c;
  }

  // Runs `c` with a stop request (signal `signal`) at a random moment of `took`, the
  // uninterrupted run's time, again sooner while the run ends before it; its result.
  TrainResult stopped_at_random(TrainConfig c, std::chrono::steady_clock::duration took, int signal) {
    std::optional<TrainResult> stopped;
    for (int attempt = 0; attempt < 8 && !(stopped && stopped->interrupted); ++attempt) {
      StopRequest stop;
      c.stop = &stop;
      std::jthread signaller([&, delay = std::uniform_real_distribution<double>(0, 1)(rng_) * took / (attempt + 1)] {
        std::this_thread::sleep_for(delay);
        stop.stop(signal);
      });
      stopped = run(c);
    }
    return *stopped;
  }

  // Resumes on `ranks` x `batch` (2 epochs) from the step-25 checkpoint of `saved`, a
  // run whose uninterrupted weights are `straight`: within rounding of them. Returns the
  // resumed run's progress output.
  std::string resumed_within_rounding(const TrainConfig& saved, const TrainResult& straight, int ranks,
                                      std::uint32_t batch) {
    TrainConfig resume = config_for(ranks, batch);
    resume.epochs = 2;
    resume.load = numbered_checkpoint(*saved.save, 25);
    std::ostringstream said;
    resume.progress = &said;
    EXPECT_LE(relative_difference(run(resume).params, straight.params), 1e-5);
    return said.str();
  }

  // Saves every `every` steps to `name` in the test's directory, keeping every checkpoint
  // (numbered_checkpoint() finds each).
  void save_all(TrainConfig& c, const char* name, std::uint32_t every) const {
    c.save = dir_ / name;
    c.save_every = every;
    c.keep = 100;
  }

  std::size_t files() const {
    return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }

  fs::path dir_;
  std::mt19937 rng_{std::random_device{}()};
};

TEST_F(ResumeTest, ResumingFromAnyStepOfSaveEveryEqualsTheUninterruptedRunBitwise) {
  for (Mode mode : {Mode::kDdp, Mode::kDp}) {
    TrainConfig c = two_epochs(mode);
    const TrainResult straight = run(c);
    c.save = dir_ / "model.safetensors";
    c.save_every = 1 + rng_() % 7;
    c.keep = 100;  // every checkpoint stays, to resume from a random one
    EXPECT_EQ(run(c).params, straight.params);
    const std::uint64_t step = c.save_every * (1 + rng_() % (39 / c.save_every));
    SCOPED_TRACE(testing::Message() << "save every " << c.save_every << ", resumed at step " << step);
    const fs::path numbered = numbered_checkpoint(*c.save, step);
    const Checkpoint mid = load_checkpoint(numbered);
    EXPECT_EQ(mid.step, step);
    EXPECT_EQ(mid.epoch * 20 + mid.epoch_step, step);
    TrainConfig resume = two_epochs(mode);
    resume.load = numbered;
    EXPECT_EQ(run(resume).params, straight.params);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
}

// Each optimizer, under a schedule, resumes mid-epoch to the uninterrupted weights bit
// for bit: its state buffers, its count of updates (Adam's bias corrections, SGD's first
// buffer) and the schedule's position at the checkpoint's step come back.
TEST_F(ResumeTest, EveryOptimizerAndScheduleResumesBitwise) {
  struct Case {
    OptimizerOptions optimizer;
    ScheduleKind schedule;
    std::uint32_t warmup;
  };
  const Case cases[] = {
      {{0.01, 0.9, 1e-4, true}, ScheduleKind::kStep, 3},
      {{1e-3, 0.0, 0.0, false, OptimizerKind::kAdam}, ScheduleKind::kOneCycle, 0},
      {{1e-3, 0.0, 1e-2, false, OptimizerKind::kAdamW}, ScheduleKind::kCosine, 5},
      {{0.5, 0.0, 0.0, false, OptimizerKind::kAdadelta, 0.9, 0.999, 1e-6}, ScheduleKind::kStep, 0},
  };
  const std::vector<float> plain_sgd = run(two_epochs(Mode::kDdp)).params;
  for (const Case& k : cases) {
    SCOPED_TRACE(testing::Message() << optimizer_name(k.optimizer.kind) << " " << schedule_name(k.schedule));
    TrainConfig c = two_epochs(Mode::kDdp);
    c.optimizer = k.optimizer;
    c.schedule.kind = k.schedule;
    c.schedule.gamma = 0.5;
    c.schedule.warmup = k.warmup;
    c.save = dir_ / "model.safetensors";
    c.save_every = 9;
    c.keep = 100;
    const TrainResult straight = run(c);
    const Checkpoint mid = load_checkpoint(numbered_checkpoint(*c.save, 27));
    EXPECT_EQ(mid.optimizer, k.optimizer.kind);
    EXPECT_EQ(mid.state.applied, 27u);
    EXPECT_EQ(mid.state.second.empty(), k.optimizer.kind == OptimizerKind::kSgd);
    TrainConfig resume = c;
    resume.save.reset();
    resume.save_every = 0;
    resume.keep = 1;
    resume.load = numbered_checkpoint(*c.save, 27);
    const TrainResult resumed = run(resume);
    EXPECT_EQ(resumed.params, straight.params);
    EXPECT_NE(straight.params, plain_sgd) << "the optimizer was not used";
    // Another optimizer cannot continue this one's state.
    resume.optimizer.kind = k.optimizer.kind == OptimizerKind::kAdam ? OptimizerKind::kAdamW : OptimizerKind::kAdam;
    resume.optimizer.momentum = 0;
    resume.optimizer.nesterov = false;
    try {
      run(resume);
      ADD_FAILURE() << "resumed with another optimizer";
    } catch (const InputError& e) {
      EXPECT_EQ(e.input(), "load");
      EXPECT_NE(std::string(e.what()).find("resume it with the same optimizer"), std::string::npos) << e.what();
    }
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
}

TEST_F(ResumeTest, KeepHoldsTheLastNAndSaveNamesTheLatest) {
  TrainConfig c = two_epochs(Mode::kDdp);
  c.save = dir_ / "model.safetensors";
  c.save_every = 3;
  c.keep = 2;
  run(c);
  // Saves at steps 3, 6, ..., 39 and at the epoch ends 20 and 40: the last two are 39, 40.
  EXPECT_EQ(files(), 3u);
  EXPECT_TRUE(fs::exists(numbered_checkpoint(*c.save, 39)));
  EXPECT_TRUE(fs::exists(numbered_checkpoint(*c.save, 40)));
  EXPECT_EQ(load_checkpoint(*c.save).step, 40u);
}

// A stop request at a random moment: every rank stops at the same step, the checkpoint
// says where, and the run resumed from it ends where the uninterrupted one does.
TEST_F(ResumeTest, AStopAtARandomTimeResumesToTheUninterruptedWeightsBitwise) {
  for (Mode mode : {Mode::kDdp, Mode::kDp}) {
    SCOPED_TRACE(mode == Mode::kDdp ? "ddp" : "dp");
    TrainConfig c = two_epochs(mode);
    const auto begin = std::chrono::steady_clock::now();
    const TrainResult straight = run(c);
    const auto took = std::chrono::steady_clock::now() - begin;
    c.interrupt_save = dir_ / "stopped.safetensors";
    const TrainResult stopped = stopped_at_random(c, took, 2);
    ASSERT_TRUE(stopped.interrupted) << "the run always ended before the stop";
    const Interruption& at = *stopped.interrupted;
    EXPECT_EQ(at.checkpoint, dir_ / "stopped.safetensors");
    EXPECT_EQ(at.epoch * 20 + at.epoch_step, at.step);
    TrainConfig resume = two_epochs(mode);
    resume.load = at.checkpoint;
    EXPECT_EQ(run(resume).params, straight.params) << "stopped at step " << at.step;
  }
}

// A stop request pending when a resumed run starts at an epoch's end: no step is taken,
// and the checkpoint it saves where it started keeps that position's test accuracy (for
// ddp and dp alike).
TEST_F(ResumeTest, AStopBeforeTheFirstStepTakesNoneAndKeepsTheTestAccuracy) {
  for (Mode mode : {Mode::kDdp, Mode::kDp}) {
    SCOPED_TRACE(mode == Mode::kDdp ? "ddp" : "dp");
    TrainConfig first = two_epochs(mode);
    first.epochs = 1;
    first.save = dir_ / "epoch1.safetensors";
    first.data_name = "IDX files";
    first.evaluate = true;  // the epoch's end measures the test accuracy
    run(first);
    const Checkpoint saved = load_checkpoint(*first.save);
    ASSERT_TRUE(saved.test_accuracy.has_value());
    EXPECT_EQ(saved.dataset, "IDX files");
    TrainConfig resume = two_epochs(mode);
    resume.load = resume.save = first.save;
    resume.data_name = "IDX files";
    resume.evaluate = true;
    StopRequest stop;
    ASSERT_TRUE(stop.start_training(true));
    stop.stop(2);
    resume.stop = &stop;
    const TrainResult stopped = run(resume);
    ASSERT_TRUE(stopped.interrupted);
    EXPECT_EQ(stopped.interrupted->step, saved.step);
    const Checkpoint again = load_checkpoint(*first.save);
    EXPECT_EQ(again.step, saved.step);
    EXPECT_EQ(again.params, saved.params);
    EXPECT_EQ(again.test_accuracy, saved.test_accuracy);
  }
}

// Fewer ranks, the same global batch: they compute the checkpoint's shards, in blocks as
// even as they go (2, 1, 1 of 4 on 3 ranks), and sum them in its world's order, so the run
// ends with the uninterrupted run's weights bit for bit, from any step of --save-every and
// from a stop at a random moment; its own checkpoints keep that world, so the run resumes
// on the ranks it started with bit for bit.
TEST_F(ResumeTest, FewerRanksResumeTheCheckpointsShardsBitwise) {
  const auto on = [](int ranks, std::uint32_t batch) {
    TrainConfig c = config_for(ranks, batch);
    c.optimizer.momentum = 0.9f;
    c.epochs = 2;
    return c;
  };
  TrainConfig c = on(4, 3);
  const TrainResult straight = run(c);
  save_all(c, "model.safetensors", 3);
  run(c);
  for (const auto& [ranks, batch, each] : {std::tuple{3, 4u, std::string("1 or 2")},
                                           std::tuple{2, 6u, std::string("2")}, std::tuple{1, 12u, std::string("4")}}) {
    const std::uint32_t step = 3 * std::uniform_int_distribution<std::uint32_t>(1, 13)(rng_);
    SCOPED_TRACE(testing::Message() << ranks << " ranks x " << batch << " from step " << step);
    TrainConfig resume = on(ranks, batch);
    resume.load = numbered_checkpoint(*c.save, step);
    std::ostringstream said;
    resume.progress = &said;
    EXPECT_EQ(run(resume).params, straight.params);
    EXPECT_NE(said.str().find("resuming a checkpoint of 4 ranks x 3 on " + std::to_string(ranks) +
                              (ranks == 1 ? " rank" : " ranks") + " x " + std::to_string(batch) +
                              ": its 4 shards of 3 computed " + each +
                              " a rank, in turn, and summed in its order: bit for bit its run"),
              std::string::npos)
        << said.str();
  }

  // From an epoch's end too.
  TrainConfig from_end = on(2, 6);
  from_end.load = numbered_checkpoint(*c.save, 20);
  EXPECT_EQ(run(from_end).params, straight.params) << "from the end of epoch 1";

  // Stopped on 3 ranks, resumed on the 4 it started with.
  TrainConfig two = on(3, 4);
  two.load = numbered_checkpoint(*c.save, 6);
  two.save = dir_ / "two.safetensors";
  const auto begin = std::chrono::steady_clock::now();
  const TrainResult whole = run(two);
  const auto took = std::chrono::steady_clock::now() - begin;
  const TrainResult stopped = stopped_at_random(two, took, 15);
  ASSERT_TRUE(stopped.interrupted) << "the run always ended before the stop";
  const Checkpoint kept = load_checkpoint(stopped.interrupted->checkpoint);
  EXPECT_EQ(kept.world, 4u);
  EXPECT_EQ(kept.batch, 3u);
  EXPECT_EQ(whole.params, straight.params);
  TrainConfig back = on(4, 3);
  back.load = stopped.interrupted->checkpoint;
  EXPECT_EQ(run(back).params, straight.params) << "stopped at step " << stopped.interrupted->step;
}

// More ranks than the checkpoint's cannot compute its shards: the same steps, summed in
// another order, within the tolerance of N ranks x B = 1 x NB; the note says so.
TEST_F(ResumeTest, MoreRanksResumeTheSameStepsWithinRounding) {
  TrainConfig c = config_for(1, 16);
  c.epochs = 2;
  const TrainResult straight = run(c);
  save_all(c, "model.safetensors", 25);
  run(c);
  const std::string said = resumed_within_rounding(c, straight, 2, 8);
  EXPECT_NE(said.find("resuming a checkpoint of 1 rank x 16 on 2 ranks x 8: the same steps, their sums rounded "
                      "otherwise (not bit for bit: more ranks than its)"),
            std::string::npos)
      << said;
}

// Only a checkpoint whose gradients were added shard by shard in world order (DDP on CPU
// devices) is resumed as shards: one of --mode dp, whose loss and sums are the global
// batch's, takes the same steps on fewer ranks with sums rounded otherwise, and says so.
TEST_F(ResumeTest, OnlyShardOrderedSumsResumeAsShards) {
  TrainConfig c = config_for(2, 8);
  c.epochs = 2;
  save_all(c, "ddp.safetensors", 25);
  run(c);
  EXPECT_TRUE(load_checkpoint(numbered_checkpoint(*c.save, 25)).shard_order);
  c.mode = Mode::kDp;
  c.save = dir_ / "dp.safetensors";
  const TrainResult straight = run(c);
  EXPECT_FALSE(load_checkpoint(numbered_checkpoint(*c.save, 25)).shard_order);
  const std::string said = resumed_within_rounding(c, straight, 1, 16);
  EXPECT_NE(said.find("mnist_mt: resuming a checkpoint of 2 ranks x 8 on 1 rank x 16: the same steps, their sums "
                      "rounded otherwise (not bit for bit: its sums were not added shard by shard)"),
            std::string::npos)
      << said;
}

// A position in an epoch counts steps of the checkpoint's global batch: another global
// batch is refused there, and taken at an epoch's end; a file that does not say goes on.
TEST_F(ResumeTest, AMidEpochCheckpointRefusesAnotherGlobalBatch) {
  TrainConfig c = config_for(2, 8);
  c.epochs = 2;
  save_all(c, "model.safetensors", 5);
  run(c);
  TrainConfig resume = config_for(2, 4);
  resume.epochs = 2;
  resume.load = numbered_checkpoint(*c.save, 5);
  try {
    run(resume);
    ADD_FAILURE() << "another global batch resumed mid-epoch";
  } catch (const InputError& e) {
    EXPECT_EQ(e.input(), "load");
    EXPECT_EQ(e.what(), resume.load->string() +
                            " stopped after step 5 of epoch 1 with a global batch of 16 images (2 ranks x 8), this "
                            "run's is 8 (2 ranks x 4): resume it with the same global batch");
  }
  resume.load = numbered_checkpoint(*c.save, 20);  // the end of epoch 1
  EXPECT_EQ(run(resume).epochs.size(), 1u);

  // A file from before the layout was recorded goes on, and says what it assumes.
  Checkpoint old = load_checkpoint(numbered_checkpoint(*c.save, 5));
  old.world = old.batch = 0;
  old.shard_order = false;
  resume.load = dir_ / "old.safetensors";
  save_checkpoint(*resume.load, old);
  std::ostringstream said;
  resume.progress = &said;
  EXPECT_EQ(run(resume).epochs.size(), 2u);
  EXPECT_NE(said.str().find("mnist_mt: " + resume.load->string() +
                            " does not record its global batch: its position, step 5 of epoch 1, is taken in steps of "
                            "this run's"),
            std::string::npos)
      << said.str();
}

// A position the run cannot continue from is refused when the file is loaded: a step
// past the end of its epoch, or a step count with no room for the run's steps.
TEST_F(ResumeTest, ACheckpointPositionOutsideTheRunIsRefusedAtLoad) {
  TrainConfig c = config_for(2, 8);
  c.epochs = 2;
  save_all(c, "model.safetensors", 5);
  run(c);
  const Checkpoint good = load_checkpoint(numbered_checkpoint(*c.save, 5));
  TrainConfig resume = c;
  resume.save.reset();
  resume.keep = 1;
  resume.save_every = 0;
  resume.load = dir_ / "bad.safetensors";
  const auto refused = [&](Checkpoint bad, const std::string& why) {
    save_checkpoint(*resume.load, bad);
    try {
      run(resume);
      ADD_FAILURE() << "resumed from " << why;
    } catch (const InputError& e) {
      EXPECT_EQ(e.input(), "load");
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  Checkpoint past = good;
  past.epoch_step = 40;  // 640 images in steps of 16
  refused(past, ": its position, step 40 of epoch 1, is past the end of an epoch of 40 steps of 16 images");
  Checkpoint full = good;
  full.step = std::numeric_limits<std::uint64_t>::max();
  refused(full, ": its step count, 18446744073709551615, leaves no room for the 80 steps of 2 more epochs");
  full.step -= 80;  // just room
  save_checkpoint(*resume.load, full);
  EXPECT_EQ(run(resume).epochs.size(), 2u);
}

// Any finite timeout works, however large: the watchdog compares seconds, which a count
// of nanoseconds would overflow past 9.2e9 s.
TEST_F(ResumeTest, AnyFiniteTimeoutLetsTheRunFinish) {
  for (double timeout : {9.3e9, 1e300}) {
    TrainConfig c = config_for(2, 8);
    c.max_steps = 3;
    c.timeout_s = timeout;
    EXPECT_EQ(run(c).epochs.size(), 1u) << timeout;
  }
}

// What the signal watch tells the user at a first signal is what happens: before
// start_training() the caller ends; a signal that came first keeps training from starting.
TEST(StopRequestTest, AFirstSignalBeforeTrainingStartsEndsTheRunAndOneAfterStopsItWithOrWithoutACheckpoint) {
  std::optional<StopRequest::Outcome> told;
  const auto announce = [&](StopRequest::Outcome outcome) { told = outcome; };
  StopRequest early;
  early.stop(2, announce);
  EXPECT_EQ(told, StopRequest::Outcome::kEndBeforeTraining);
  EXPECT_FALSE(early.start_training(true));
  for (const bool saves : {true, false}) {
    StopRequest later;
    EXPECT_TRUE(later.start_training(saves));
    later.stop(15, [&](StopRequest::Outcome outcome) {
      told = outcome;
      EXPECT_EQ(later.stop_signal(), 0) << "the request was seen before it was announced";
    });
    EXPECT_EQ(told, saves ? StopRequest::Outcome::kCheckpoint : StopRequest::Outcome::kNoCheckpoint);
    EXPECT_EQ(later.stop_signal(), 15);
  }
}

TEST_F(ResumeTest, AnAbortRequestReleasesEveryRankAndThrowsInterrupted) {
  TrainConfig c = config_for(3, 8);
  c.epochs = 1000;  // far longer than the test
  StopRequest stop;
  c.stop = &stop;
  std::jthread signaller([&] {
    std::this_thread::sleep_for(200ms);
    stop.stop(15);
    stop.abort(15);
  });
  const auto begin = std::chrono::steady_clock::now();
  try {
    run(c);
    ADD_FAILURE() << "not interrupted";
  } catch (const Interrupted& e) {
    EXPECT_EQ(e.signal(), 15);
  } catch (const std::exception& e) {
    // The stop may win the race: then the run ends at a step with a checkpoint.
    ADD_FAILURE() << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - begin, 20s);
}

// A rank waiting for data or never joining a collective: the watchdog fails the run
// naming the rank, the step and the phase, within the timeout and a few seconds.
TEST_F(ResumeTest, AStalledRankFailsTheRunWithinTheTimeout) {
  for (StallPhase phase : {StallPhase::kData, StallPhase::kCollective}) {
    TrainConfig c = config_for(3, 8);
    c.timeout_s = 1;
    const StallInjection stall{static_cast<int>(rng_() % 3), rng_() % 20, phase};
    c.faults.stall = stall;
    const std::string name = phase == StallPhase::kData ? "data" : "collective";
    const std::string expected = "rank " + std::to_string(stall.rank) + " failed at step " +
                                 std::to_string(stall.step) + ": stalled in phase " + name;
    SCOPED_TRACE(expected);
    const auto begin = std::chrono::steady_clock::now();
    try {
      run(c);
      ADD_FAILURE() << "no failure";
    } catch (const RuntimeFailure& e) {
      EXPECT_EQ(std::string(e.what()).rfind(expected, 0), 0u) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - begin, 10s);
  }
}

TEST_F(ResumeTest, ADivergedRunStopsAndKeepsTheLastGoodCheckpoint) {
  TrainConfig c = config_for(2, 8);
  c.save = dir_ / "model.safetensors";
  run(c);
  std::ifstream before_file(*c.save, std::ios::binary);
  const std::string before((std::istreambuf_iterator<char>(before_file)), {});
  c.load = c.save;
  c.epochs = 3;
  c.optimizer.lr = 1e30f;
  try {
    run(c);
    ADD_FAILURE() << "a diverged run went on";
  } catch (const RuntimeFailure& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("non-finite training loss") != std::string::npos ||
                what.find("non-finite gradient norm") != std::string::npos ||
                what.find("non-finite value") != std::string::npos)
        << what;
  }
  std::ifstream after_file(*c.save, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(after_file)), {}), before);
}

// --on-nan skip at a random step of a random rank drops that step's update on every
// rank alike: the run ends with the weights of one that never took the step, which is
// the checkpoint after the step before, resumed one batch further on.
TEST_F(ResumeTest, ASkippedNonFiniteStepIsDroppedOnEveryRankAlike) {
  for (Mode mode : {Mode::kDdp, Mode::kDp}) {
    TrainConfig c = two_epochs(mode);
    c.on_nan = NanPolicy::kSkip;
    const NanInjection nan{static_cast<int>(rng_() % 2), 1 + rng_() % 38};
    c.faults.nan = nan;
    SCOPED_TRACE(testing::Message() << "rank " << nan.rank << " step " << nan.step);
    const TrainResult skipped = run(c);
    ASSERT_EQ(skipped.epochs.size(), 2u);
    EXPECT_EQ(skipped.epochs[0].skipped_steps + skipped.epochs[1].skipped_steps, 1u);
    EXPECT_TRUE(std::isfinite(skipped.epochs[nan.step / 20].train_loss));

    TrainConfig save = two_epochs(mode);
    save.save = dir_ / "model.safetensors";
    save.save_every = static_cast<std::uint32_t>(nan.step);
    save.keep = 100;
    const TrainResult straight = run(save);
    EXPECT_NE(straight.params, skipped.params);
    Checkpoint before = load_checkpoint(numbered_checkpoint(*save.save, nan.step));
    before.step += 1;
    if (++before.epoch_step == 20) before.epoch += 1, before.epoch_step = 0;
    TrainConfig resume = two_epochs(mode);
    resume.load = dir_ / "one-further.safetensors";
    save_checkpoint(*resume.load, before);
    EXPECT_EQ(run(resume).params, skipped.params);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
}

// --on-nan stop: the rank whose loss is NaN fails the run at that step.
TEST_F(ResumeTest, ANonFiniteLossStopsTheRunNamingRankAndStep) {
  for (Mode mode : {Mode::kDdp, Mode::kDp}) {
    TrainConfig c = two_epochs(mode);
    const NanInjection nan{static_cast<int>(rng_() % 2), rng_() % 40};
    c.faults.nan = nan;
    const std::string expected = "rank " + std::to_string(nan.rank) + " failed at step " + std::to_string(nan.step) +
                                 ": non-finite training loss";
    try {
      run(c);
      ADD_FAILURE() << "no failure: " << expected;
    } catch (const RuntimeFailure& e) {
      EXPECT_EQ(std::string(e.what()).rfind(expected, 0), 0u) << e.what();
    }
  }
}

}  // namespace
}  // namespace mnist_mt
