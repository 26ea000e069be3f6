#pragma once
// `mnist_mt eval`: a checkpoint on the test set, with the evaluation code training runs
// after each epoch, on any backend's devices (a worker thread per device, each on its
// shard of the test set).
#include <array>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/model.hpp"  // ConfusionMatrix

namespace mnist_mt {

struct EvalConfig {
  std::vector<int> devices;  // rank i drives devices[i]
  std::uint32_t batch = 64;  // per device
  std::filesystem::path checkpoint;
};

struct EvalResult {
  double loss = 0;      // mean NLL
  double accuracy = 0;  // fraction
  std::uint64_t samples = 0;
  ConfusionMatrix confusion{};
  // Correct / samples of each label; NaN for a label with no samples.
  std::array<double, kClasses> class_accuracy() const;
};

// Throws InputError for a bad checkpoint (input() "load") or config, RuntimeFailure
// ("rank R failed ...") for a failure while running.
EvalResult evaluate(Backend& backend, const Dataset& data, const EvalConfig& config);

}  // namespace mnist_mt
