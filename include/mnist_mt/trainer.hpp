#pragma once
// Data-parallel training over a backend's devices: DDP (a worker thread per device,
// bucketed allreduce overlapping backward) or the DataParallel-style baseline (one host
// thread drives every device). DESIGN.md decisions 3, 4, 7, 9.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/replica.hpp"

namespace mnist_mt {

enum class Mode { kDdp, kDp };

struct FaultInjection {  // tests: rank `rank` throws at global step `step`
  int rank = 0;
  std::uint64_t step = 0;
};

struct TrainConfig {
  Mode mode = Mode::kDdp;
  // Device ids; rank i drives devices[i]. An id may repeat: ranks that share a GPU
  // exchange gradients through pinned host memory instead of NCCL (slow, but it runs
  // the multi-rank GPU code on a one-GPU host; the CLI refuses it).
  std::vector<int> devices;
  std::uint32_t epochs = 1;
  std::uint32_t batch = 64;        // per device
  SgdOptions sgd;
  std::uint64_t seed = 1;
  double bucket_mb = 25.0;         // cap of every bucket but the first (which is min(1 MB, cap))
  std::optional<std::filesystem::path> load;
  std::optional<std::filesystem::path> save;
  std::optional<std::filesystem::path> metrics;
  std::optional<FaultInjection> fault;
  std::uint32_t max_steps = 0;     // per epoch, 0 = all (tests and benchmarks)
  bool evaluate = true;
  std::ostream* progress = nullptr;  // rank 0's progress lines and epoch summaries
};

struct PhaseSeconds {
  double data_wait = 0, forward = 0, backward = 0, comm_wait = 0, optimizer = 0;
};

struct EpochMetrics {
  std::uint32_t epoch = 0;
  double train_loss = 0;
  double test_loss = 0;
  double test_accuracy = 0;   // fraction
  double images_per_s = 0;    // training images per second, all ranks together
  double seconds = 0;
  std::uint64_t steps = 0;
  PhaseSeconds phase_seconds;  // rank 0's
};

struct TrainResult {
  std::vector<EpochMetrics> epochs;
  std::vector<float> params;  // final parameters (rank 0's)
};

// A worker failure surfaces as RuntimeFailure("rank R failed at step S: why").
TrainResult train(Backend& backend, const Dataset& data, const TrainConfig& config);

}  // namespace mnist_mt
