#include "exchange.hpp"

#include <algorithm>
#include <string>

#include "mnist_mt/error.hpp"

namespace mnist_mt {

bool exchanges_factors(const TrainConfig& config, const Place& place, std::uint32_t shards, const Backend& backend) {
  if (config.exchange == Exchange::kGradients) return false;
  const bool asked = config.exchange == Exchange::kFactors;
  std::vector<int> ids = config.devices;
  std::sort(ids.begin(), ids.end());
  const std::string why =
      config.mode != Mode::kDdp ? "--mode dp gathers the network's outputs instead"
      : !backend.exchanges_factors() ? "fc1's factors are exchanged on CPU devices (--cpu) with fp32 products only"
      : std::adjacent_find(ids.begin(), ids.end()) != ids.end() ? "ranks that share a device cannot exchange them"
      : shards != static_cast<std::uint32_t>(place.world)
          ? "this run resumes a checkpoint of " + std::to_string(shards) + " ranks on " +
                std::to_string(place.world) + ", each computing several of its shards"
          : "";
  if (!why.empty()) {
    if (!asked) return false;
    throw InputError("'factors' cannot run here: " + why + "; use gradients or auto", "exchange");
  }
  return asked || factors_pay(config.batch, place);
}

// Bytes alone favour factors while batch x world < 2 x fc1's parameters / kFactorWidth
// (252 images): a ring allreduce sends 2(W-1)/W x P floats a rank, the allgather (W-1) x
// B x kFactorWidth. But each rank then forms fc1's weight product over W x B rows instead
// of B, and within one process the allreduce is a pass over shared memory, not a wire.
// Measured on 2 cores (docs/benchmarks.md, "Exchanging fc1's factors"), factors against
// gradients at batch 1, 4, 16, 64 a rank: across 2 processes over TCP 3.89x, 2.44x, 1.54x,
// 1.04x; in one process 1.58x, 1.28x, 0.94x, 0.94x. So auto takes factors where the world
// spans processes and its batch (B x W) is at most 64, and in one process up to 8.
bool factors_pay(std::uint32_t batch, const Place& place) {
  const std::uint64_t world_batch = std::uint64_t{batch} * static_cast<std::uint64_t>(place.world);
  return place.world > 1 && world_batch <= (place.process_count() > 1 ? 64u : 8u);
}

std::array<double, kLayers> bytes_sent_per_step(bool factors, std::uint32_t batch, int world) {
  std::array<double, kLayers> bytes{};
  const double w = world;
  for (int layer = 0; layer < kLayers; ++layer) {
    const double count = static_cast<double>(layer_range(layer).count);
    bytes[static_cast<std::size_t>(layer)] = 2.0 * (w - 1.0) / w * count * sizeof(float);
  }
  if (factors) bytes[kFc1] = (w - 1.0) * batch * static_cast<double>(kFactorWidth) * sizeof(float);
  return bytes;
}

}  // namespace mnist_mt
