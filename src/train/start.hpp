#pragma once
// Where a run starts: its place in the world, the parameters and loop state it starts from
// (a checkpoint's, checked against the run, or fresh ones), and how its ranks compute the
// world's batch.
#include <cstdint>
#include <string>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/trainer.hpp"

namespace mnist_mt {

// How a run's ranks compute the world's batch. Normally a shard of it each, of the
// configured batch. A DDP run on CPU devices in one process that resumes a checkpoint
// made by more ranks, with the same global batch, whose sums were added shard by shard
// (Checkpoint::shard_order), computes that run's shards instead:
// `shards` of `batch` images, in blocks of consecutive shards, as even as they go, each
// rank its block in turn; the gradients are summed in shard order, so its weights are
// that run's, bit for bit.
struct ShardLayout {
  std::uint32_t shards = 0;  // the world's
  std::uint32_t batch = 0;
  std::string note;  // for the progress stream when resuming under another rank count
};

// This process's ranks in the world: the processes agree that each runs as many ranks of
// the same kind of device, on the same data, with the same training settings and products
// (a launch whose processes were given different flags would meet in different
// collectives, or train apart).
Place place_of(const TrainConfig& config, const Dataset& data, const Backend& backend);
// Across the processes of a launch (place.processes): that every one starts from the same
// weights, seed and position, i.e. loaded the same checkpoint (SameOnEveryProcess if not).
void agree_on_start(const Checkpoint& start, const Place& place);
// The checkpoint's parameters, optimizer state and loop state, checked against the run
// and the data, or fresh parameters from the seed. Throws InputError ("load", "batch").
Checkpoint starting_point(const TrainConfig& config, const Dataset& data, int world);
// The steps of an epoch whose loader has `loader_steps`: all of them, or --max-steps
// when fewer (0: no limit).
inline std::uint32_t steps_in_epoch(std::uint32_t loader_steps, std::uint32_t max_steps) {
  return max_steps > 0 && max_steps < loader_steps ? max_steps : loader_steps;
}
// Whether a run adds its gradients shard by shard in world order (Checkpoint::shard_order).
bool sums_in_shard_order(const TrainConfig& config, const Place& place, const Backend& backend);
// How the run's ranks compute the world's batch (ShardLayout).
ShardLayout layout_of(const TrainConfig& config, const Place& place, const Checkpoint& start, const Backend& backend);

}  // namespace mnist_mt
