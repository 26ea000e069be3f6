#include "mnist_mt/sampler.hpp"

#include <numeric>
#include <stdexcept>
#include <utility>

#include "mnist_mt/philox.hpp"

namespace mnist_mt {
namespace {

// Third counter word of the shuffle's Philox stream; distinct from every RandomStream
// value in philox.hpp, so the shuffle never draws numbers the other streams use.
constexpr std::uint32_t kShuffleStream = 0x5eedu;

// Philox4x32-10 words in counter order for one (seed, epoch): the same sequence on every
// platform and compiler, unlike the standard distributions.
class ShuffleWords {
 public:
  ShuffleWords(std::uint64_t seed, std::uint32_t epoch)
      : k0_(static_cast<std::uint32_t>(seed)), k1_(static_cast<std::uint32_t>(seed >> 32)), epoch_(epoch) {}

  std::uint32_t next() {
    if (used_ == 4) {
      block_ = philox4x32_10(Philox4{{counter_lo_, counter_hi_, kShuffleStream, epoch_}}, k0_, k1_);
      if (++counter_lo_ == 0) ++counter_hi_;
      used_ = 0;
    }
    return block_.v[used_++];
  }

  // Uniform in [0, range), range > 0, without modulo bias (Lemire's multiply-shift with rejection).
  std::uint32_t below(std::uint32_t range) {
    std::uint64_t m = std::uint64_t{next()} * range;
    if (static_cast<std::uint32_t>(m) < range) {
      const std::uint32_t threshold = static_cast<std::uint32_t>(-range) % range;
      while (static_cast<std::uint32_t>(m) < threshold) m = std::uint64_t{next()} * range;
    }
    return static_cast<std::uint32_t>(m >> 32);
  }

 private:
  std::uint32_t k0_, k1_, epoch_;
  std::uint32_t counter_lo_ = 0, counter_hi_ = 0;
  Philox4 block_{};
  unsigned used_ = 4;
};

}  // namespace

std::vector<std::uint32_t> epoch_permutation(std::uint64_t seed, std::uint32_t epoch, std::uint32_t n) {
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  ShuffleWords words(seed, epoch);
  for (std::uint32_t i = n; i > 1; --i) std::swap(order[i - 1], order[words.below(i)]);
  return order;
}

std::uint32_t ShardPlan::steps() const {
  const std::uint64_t global = std::uint64_t{batch} * world;
  if (global == 0) return 0;
  return static_cast<std::uint32_t>(drop_last ? samples / global : (samples + global - 1) / global);
}

std::uint32_t ShardPlan::shard(std::uint32_t rank, std::uint32_t step, std::span<std::uint32_t> positions) const {
  if (rank >= world) throw std::out_of_range("ShardPlan::shard: rank out of range");
  if (positions.size() < batch) throw std::out_of_range("ShardPlan::shard: positions shorter than the batch");
  if (step >= steps()) return 0;
  const std::uint64_t first = std::uint64_t{step} * batch * world + rank;
  std::uint32_t count = 0;
  for (std::uint64_t pos = first; count < batch && pos < samples; pos += world)
    positions[count++] = static_cast<std::uint32_t>(pos);
  return count;
}

}  // namespace mnist_mt
