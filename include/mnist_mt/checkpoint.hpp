#pragma once
// safetensors checkpoints (docs/architecture.md decision 13): the parameters under PyTorch's names
// and shapes, so torch loads them as they are; the optimizer's state buffers as
// "<PyTorch's state name>.<name>" (momentum_buffer, exp_avg, exp_avg_sq, square_avg,
// acc_delta); the optimizer, its updates applied and the loop state in the metadata.
// Writes are atomic.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mnist_mt/optimizer.hpp"

namespace mnist_mt {

struct Checkpoint {
  std::vector<float> params;    // kParamCount, state-dict order
  OptimizerKind optimizer = OptimizerKind::kSgd;
  // state_buffers(optimizer) buffers, or none (a file of parameters only)
  OptimizerState state;
  std::uint32_t epoch = 0;      // epochs completed
  std::uint32_t epoch_step = 0; // steps done in the epoch after those (mid-epoch checkpoints)
  std::uint64_t step = 0;       // optimizer steps taken
  std::uint64_t seed = 0;
  // The layout whose sums made the parameters: the world's shards (a rank each, unless a
  // rank computed several, Run's shards) and the batch of each. 0: not recorded (files
  // from before these fields).
  std::uint32_t world = 0;
  std::uint32_t batch = 0;
  // Whether its run added the gradients shard by shard in world order (DDP on CPU
  // devices, in one process or with a rank a process), so that a run of fewer ranks can
  // repeat its sums bit for bit.
  bool shard_order = false;
  // Whether fc1's weight gradient was formed from every rank's factors
  // (TrainConfig::exchange) rather than summed.
  bool fc1_factors = false;
  // Whether its run's fc1 and fc2 products read bfloat16 operands (--precision bf16).
  bool bf16_products = false;
  // The test accuracy (a fraction) its run measured at its position, where it evaluated
  // there (an epoch's end, or where --target-accuracy was reached); none otherwise.
  std::optional<double> test_accuracy;
  // The flags that shape the steps from its position, as its run had them
  // (trajectory_settings in mnist_mt/trainer.hpp): flag and value text, in the metadata
  // under the flag's name. None in files from before they were recorded.
  std::vector<std::pair<std::string, std::string>> settings;
  // The data set its run trained on, as told (TrainConfig::data_name: "MNIST",
  // "Fashion-MNIST", "IDX files"); empty in files from before it was recorded.
  std::string dataset;
  std::uint64_t global_batch() const { return std::uint64_t{world} * batch; }
};

// The shortest text that reads back as `value`'s bits (the metadata's numbers); 0 for -0.
std::string exact_text(double value);

// Temp file in the same directory, fsync, rename, fsync of the directory. Throws
// InputError when the path cannot be created, RuntimeFailure when writing it fails
// (a full disk); either way the file that was there stays as it was.
void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint);
// Throws InputError for a missing, truncated, corrupt or mismatched file, or one with a
// non-finite value; never returns a partial checkpoint.
Checkpoint load_checkpoint(const std::filesystem::path& path);

}  // namespace mnist_mt
