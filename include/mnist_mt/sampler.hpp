#pragma once
// DistributedSampler semantics (docs/architecture.md decision 8).
#include <cstdint>
#include <span>
#include <vector>

namespace mnist_mt {

// The epoch's order of sample indices: a permutation of [0, n) that depends on
// (seed, epoch) only, never on the world size.
std::vector<std::uint32_t> epoch_permutation(std::uint64_t seed, std::uint32_t epoch, std::uint32_t n);

// How one epoch's order is cut into per-rank batches.
// Global step k covers positions [k*B*W, (k+1)*B*W) of the order; rank r takes
// positions k*B*W + r, + r + W, ... of it.
struct ShardPlan {
  std::uint32_t samples = 0;  // n
  std::uint32_t world = 1;    // W
  std::uint32_t batch = 1;    // B, per rank
  bool drop_last = true;      // training: drop the incomplete last global batch;
                              // evaluation: keep it, so every sample counts once

  std::uint32_t steps() const;
  // Positions (into the epoch order) of rank `rank`'s batch at `step`; at most B of them.
  // With drop_last=false the last step's shards may be short, or empty.
  std::uint32_t shard(std::uint32_t rank, std::uint32_t step, std::span<std::uint32_t> positions) const;
};

}  // namespace mnist_mt
