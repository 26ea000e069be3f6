// The trainer on the CUDA backend, judged by its saved checkpoints (--save): on one GPU,
// ranks that share it train what one rank of their global batch trains (ddp and dp),
// one GPU trains what one CPU rank trains, a failing rank among peers on the GPU stops
// every rank, a resumed run continues an uninterrupted one bit for bit, a step replayed
// as a CUDA graph trains what the step enqueued call by call does, and holds timing
// events only when the phases are asked for. Needs a GPU
// (gpu_main.cpp); several ranks on one GPU meet in the local group (src/comm).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/trainer.hpp"
#include "train_fixture.hpp"

namespace mnist_mt {
namespace {

using testing_fixture::noise_split;
using testing_fixture::relative_difference;

constexpr std::uint32_t kSteps = 20;

// 20 steps of a global batch of 64.
const Dataset& dataset() {
  static const Dataset data{noise_split(64 * kSteps, 1), noise_split(101, 2)};
  return data;
}

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("mnist_mt_" + name + "_" + std::to_string(::getpid()) + ".safetensors");
}

// As the CPU trainer tests: a small step and no momentum keep rounding from flipping a
// ReLU or a pooling choice by more than the comparisons allow.
TrainConfig config_for(std::vector<int> devices, std::uint32_t batch, Mode mode = Mode::kDdp) {
  TrainConfig c;
  c.mode = mode;
  c.devices = std::move(devices);
  c.batch = batch;
  c.max_steps = kSteps;
  c.seed = 7;
  c.optimizer = {0.001f, 0.0f, 1e-4f};
  c.evaluate = false;
  return c;
}

// Trains, and returns the parameters of the checkpoint it saved.
std::vector<float> saved_params(const std::string& backend_name, TrainConfig config, const BackendOptions& options = {}) {
  const auto path = temp_file(backend_name);
  config.save = path;
  auto backend = backend_name == "cpu" ? make_cpu_backend(options) : make_cuda_backend(options);
  train(*backend, dataset(), config);
  Checkpoint saved = load_checkpoint(path);
  std::filesystem::remove(path);
  return saved.params;
}

TEST(CudaTrainer, RanksSharingTheGpuTrainWhatOneRankOfTheirGlobalBatchTrains) {
  const std::vector<float> one = saved_params("cuda", config_for({0}, 64));
  TrainConfig still = config_for({0}, 64);
  still.optimizer.lr = 0;
  // Training moved the weights, so the comparisons mean something.
  ASSERT_GT(relative_difference(one, saved_params("cuda", still)), 1e-3);
  for (Mode mode : {Mode::kDdp, Mode::kDp}) {
    SCOPED_TRACE(mode == Mode::kDp ? "dp" : "ddp");
    EXPECT_LE(relative_difference(saved_params("cuda", config_for({0, 0}, 32, mode)), one), 1e-5);
    TrainConfig buckets = config_for({0, 0, 0, 0}, 16, mode);
    buckets.bucket_mb = 0.001;  // a bucket per layer, each overlapping the rest of backward
    EXPECT_LE(relative_difference(saved_params("cuda", buckets), one), 1e-5);
  }
}

// Batch 64 runs fc2 with the loss in one kernel (fc2_loss), batch 300 (4 steps) the
// cuBLAS products and log_softmax_nll, as calls of more than 256 rows do.
TEST(CudaTrainer, OneGpuTrainsWhatOneCpuRankTrains) {
  BackendOptions deterministic;
  deterministic.deterministic = true;
  for (const std::uint32_t batch : {64u, 300u}) {
    SCOPED_TRACE(testing::Message() << "batch " << batch);
    const TrainConfig c = config_for({0}, batch);
    EXPECT_LE(relative_difference(saved_params("cuda", c, deterministic), saved_params("cpu", c)), 1e-4);
  }
}

// Injects a fault at `rank`'s step 5: the run fails naming them, within 30 s.
void expect_fault_ends_the_run(TrainConfig c, int rank) {
  c.faults.fault = FaultInjection{rank, 5};
  auto backend = make_cuda_backend({});
  const auto start = std::chrono::steady_clock::now();
  try {
    train(*backend, dataset(), c);
    ADD_FAILURE() << "no failure";
  } catch (const RuntimeFailure& e) {
    EXPECT_EQ(std::string(e.what()), "rank " + std::to_string(rank) + " failed at step 5: injected fault");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(CudaTrainer, AFailingRankAmongPeersOnTheGpuStopsEveryRank) {
  for (Mode mode : {Mode::kDdp, Mode::kDp}) {
    SCOPED_TRACE(mode == Mode::kDp ? "dp" : "ddp");
    expect_fault_ends_the_run(config_for({0, 0, 0}, 16, mode), 2);
  }
}

// Deterministic algorithms, and sums in rank order on the host: a rerun repeats every
// bit, so a resumed run must equal the uninterrupted one exactly.
TEST(CudaTrainer, ResumingWithPeersOnTheGpuContinuesBitForBit) {
  BackendOptions deterministic;
  deterministic.deterministic = true;
  auto backend = make_cuda_backend(deterministic);
  TrainConfig c = config_for({0, 0}, 32);
  c.optimizer.momentum = 0.9f;  // the checkpoint carries the momentum
  c.max_steps = kSteps / 2;
  c.epochs = 2;
  const TrainResult straight = train(*backend, dataset(), c);
  const auto path = temp_file("resume");
  c.epochs = 1;
  c.save = path;
  train(*backend, dataset(), c);
  c.save.reset();
  c.load = path;
  const TrainResult resumed = train(*backend, dataset(), c);
  std::filesystem::remove(path);
  EXPECT_EQ(resumed.params, straight.params);
}

// One rank on the GPU records its step as a CUDA graph (its communicator is NCCL's) and
// replays it: with deterministic algorithms every bit equals the step enqueued call by
// call (--no-cuda-graphs), momentum included, into a second epoch, whose dropout masks
// the replays key with the epoch their input upload carries. No warning: the graph was
// made and used.
TEST(CudaTrainer, AReplayedStepGraphTrainsWhatTheEnqueuedStepTrains) {
  BackendOptions graphs, eager;
  graphs.deterministic = eager.deterministic = true;
  eager.cuda_graphs = false;
  TrainConfig c = config_for({0}, 64);
  c.optimizer.momentum = 0.9f;  // the first update starts the buffer: a flag on the device
  c.max_steps = kSteps / 2;
  c.epochs = 2;
  const auto run = [&](const BackendOptions& options) {
    const auto path = temp_file(options.cuda_graphs ? "graphs" : "eager");
    TrainConfig saving = c;
    saving.save = path;
    auto backend = make_cuda_backend(options);
    train(*backend, dataset(), saving);
    Checkpoint saved = load_checkpoint(path);
    std::filesystem::remove(path);
    return saved;
  };
  ::testing::internal::CaptureStderr();
  const Checkpoint replayed = run(graphs);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warnings.find("CUDA graphs off"), std::string::npos) << warnings;
  const Checkpoint enqueued = run(eager);
  EXPECT_EQ(replayed.params, enqueued.params);
  EXPECT_EQ(replayed.state.first, enqueued.state.first);
  EXPECT_EQ(replayed.state.applied, enqueued.state.applied);
  TrainConfig still = c;
  still.optimizer.lr = 0;
  EXPECT_GT(relative_difference(replayed.params, saved_params("cuda", still, graphs)), 1e-3);
}

// The data set held in GPU memory (the default) against batches copied from the host
// (--no-device-data): every bit of the saved parameters and momentum, and the evaluation,
// for the replayed ddp step (which gathers its rows by the device's step counter,
// Replica::plan_epoch, as planned_input says) into a second epoch, with evaluations
// between its steps (a target that is never reached), and for --mode dp (device 0's
// batch gathered by its indices, no plan).
TEST(CudaTrainer, TheDataHeldOnTheGpuTrainsAsTheCopiedBatches) {
  BackendOptions held, copied;
  held.deterministic = copied.deterministic = true;
  copied.device_data = false;
  for (const Mode mode : {Mode::kDdp, Mode::kDp}) {
    const char* name = mode == Mode::kDp ? "dp" : "ddp";
    TrainConfig c = config_for({0}, 64, mode);
    c.optimizer.momentum = 0.9f;
    c.max_steps = kSteps / 2;
    c.epochs = 2;
    c.evaluate = true;
    c.target_accuracy = 1.0;
    c.eval_every = 3;
    const auto run = [&](const BackendOptions& options, TrainResult& result) {
      const auto path = temp_file(options.device_data ? "held" : "copied");
      TrainConfig saving = c;
      saving.save = path;
      auto backend = make_cuda_backend(options);
      result = train(*backend, dataset(), saving);
      Checkpoint saved = load_checkpoint(path);
      std::filesystem::remove(path);
      return saved;
    };
    TrainResult a, b;
    const Checkpoint on_gpu = run(held, a);
    const Checkpoint from_host = run(copied, b);
    EXPECT_EQ(on_gpu.params, from_host.params) << name;
    EXPECT_EQ(on_gpu.state.first, from_host.state.first) << name;
    ASSERT_FALSE(a.epochs.empty());
    EXPECT_EQ(a.epochs.back().test_accuracy, b.epochs.back().test_accuracy) << name;
    EXPECT_EQ(a.epochs.back().test_loss, b.epochs.back().test_loss) << name;
    EXPECT_EQ(a.epochs.back().planned_input, mode == Mode::kDdp) << name;
    EXPECT_FALSE(b.epochs.back().planned_input) << name;
  }
}

// A replayed step holds no timing events unless its phases are asked for: it is timed
// whole (PhaseSeconds::replayed), and its graph has exactly the four marks fewer that
// --phase-times records inside it (forward, backward, comm wait, end; the begin mark is
// made before the launch). A world of one rank holds no collective, so nothing is on the
// comm stream between backward and the comm wait.
TEST(CudaTrainer, AReplayedStepIsTimedWholeUnlessItsPhasesAreAsked) {
  BackendOptions deterministic;  // the same cuDNN algorithms, so the same nodes, in both runs
  deterministic.deterministic = true;
  auto backend = make_cuda_backend(deterministic);
  TrainConfig lean = config_for({0}, 64);
  TrainConfig phases = lean;
  phases.phase_times = true;
  const EpochMetrics a = train(*backend, dataset(), lean).epochs.back();
  const EpochMetrics b = train(*backend, dataset(), phases).epochs.back();
  ASSERT_TRUE(a.graph_nodes && b.graph_nodes);
  EXPECT_EQ(*b.graph_nodes, *a.graph_nodes + 4);
  EXPECT_GT(a.phase_seconds.replayed, 0.0);
  EXPECT_EQ(a.phase_seconds.forward + a.phase_seconds.backward + a.phase_seconds.optimizer, 0.0);
  EXPECT_EQ(b.phase_seconds.replayed, 0.0);
  EXPECT_GT(b.phase_seconds.forward, 0.0);
  EXPECT_GT(b.phase_seconds.backward, 0.0);
  EXPECT_GT(b.phase_seconds.optimizer, 0.0);
  EXPECT_LT(b.phase_seconds.comm_wait, 0.1 * b.phase_seconds.backward);
}

// A rank that fails while its step graphs hold NCCL's communicator: the abort (which
// waits for those graphs to be released) does not hang the run.
TEST(CudaTrainer, AFailingRankWithRecordedStepsEndsTheRun) { expect_fault_ends_the_run(config_for({0}, 64), 0); }

}  // namespace
}  // namespace mnist_mt
