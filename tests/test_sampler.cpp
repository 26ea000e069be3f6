// DistributedSampler semantics: the epoch order depends on (seed, epoch) only, shards of a
// global batch are disjoint and cover it, every rank runs the same number of steps, and
// W ranks x batch B see exactly the samples of 1 rank x batch W*B.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "mnist_mt/sampler.hpp"

namespace mnist_mt {
namespace {

using Positions = std::vector<std::uint32_t>;

Positions shard(const ShardPlan& plan, std::uint32_t rank, std::uint32_t step) {
  Positions out(plan.batch);
  out.resize(plan.shard(rank, step, out));
  return out;
}

TEST(EpochPermutation, IsAPermutation) {
  for (std::uint32_t n : {0u, 1u, 2u, 3u, 1000u, 60000u}) {
    Positions order = epoch_permutation(42, 3, n);
    ASSERT_EQ(order.size(), n);
    std::sort(order.begin(), order.end());
    Positions identity(n);
    std::iota(identity.begin(), identity.end(), 0u);
    EXPECT_EQ(order, identity) << "n=" << n;
  }
}

TEST(EpochPermutation, DependsOnSeedAndEpochOnly) {
  EXPECT_EQ(epoch_permutation(7, 2, 60000), epoch_permutation(7, 2, 60000));
  EXPECT_NE(epoch_permutation(7, 2, 60000), epoch_permutation(7, 3, 60000));
  EXPECT_NE(epoch_permutation(7, 2, 60000), epoch_permutation(8, 2, 60000));
  // The high half of the seed counts too.
  EXPECT_NE(epoch_permutation(7, 2, 1000), epoch_permutation(7 + (std::uint64_t{1} << 32), 2, 1000));
}

TEST(EpochPermutation, IsPinnedAcrossPlatformsAndReleases) {
  // Philox4x32-10 and integer arithmetic only: these orders must never change, or runs
  // resumed from a checkpoint on another machine would see other batches. The values
  // agree with a separate Python model of the same Philox + Fisher-Yates shuffle.
  EXPECT_EQ(epoch_permutation(0, 0, 10), (Positions{5, 0, 4, 3, 9, 1, 6, 7, 2, 8}));
  EXPECT_EQ(epoch_permutation(1234, 5, 10), (Positions{0, 5, 9, 2, 6, 1, 8, 4, 7, 3}));
}

TEST(EpochPermutation, EveryOrderIsEquallyLikely) {
  // 3! orders over 60000 seeds: each expected 10000 times, standard deviation ~91.
  std::map<Positions, int> seen;
  for (std::uint64_t seed = 0; seed < 60000; ++seed) ++seen[epoch_permutation(seed, 0, 3)];
  ASSERT_EQ(seen.size(), 6u);
  for (const auto& [order, count] : seen) EXPECT_NEAR(count, 10000, 500);
}

TEST(ShardPlan, StepCounts) {
  EXPECT_EQ((ShardPlan{60000, 3, 64, true}).steps(), 312u);  // 60000 / 192, rest dropped
  EXPECT_EQ((ShardPlan{60000, 3, 64, false}).steps(), 313u);
  EXPECT_EQ((ShardPlan{10000, 4, 1000, false}).steps(), 3u);
  EXPECT_EQ((ShardPlan{10, 4, 8, true}).steps(), 0u);
  EXPECT_EQ((ShardPlan{0, 2, 8, false}).steps(), 0u);
}

TEST(ShardPlan, RankTakesEveryWthPositionOfTheGlobalBatch) {
  const ShardPlan plan{100, 3, 4, true};
  EXPECT_EQ(shard(plan, 0, 0), (Positions{0, 3, 6, 9}));
  EXPECT_EQ(shard(plan, 2, 0), (Positions{2, 5, 8, 11}));
  EXPECT_EQ(shard(plan, 1, 5), (Positions{61, 64, 67, 70}));
}

TEST(ShardPlan, TrainingShardsAreFullDisjointAndCoverEachGlobalBatch) {
  for (std::uint32_t world = 1; world <= 5; ++world) {
    for (std::uint32_t batch = 1; batch <= 7; ++batch) {
      for (std::uint32_t n : {0u, 1u, 34u, 35u, 100u, 257u}) {
        const ShardPlan plan{n, world, batch, true};
        ASSERT_EQ(plan.steps(), n / (world * batch));
        for (std::uint32_t step = 0; step < plan.steps(); ++step) {
          Positions all;
          for (std::uint32_t r = 0; r < world; ++r) {
            const Positions mine = shard(plan, r, step);
            ASSERT_EQ(mine.size(), batch) << "every rank gets a full batch at every step";
            all.insert(all.end(), mine.begin(), mine.end());
          }
          std::sort(all.begin(), all.end());
          Positions global(world * batch);
          std::iota(global.begin(), global.end(), step * world * batch);
          ASSERT_EQ(all, global) << "W=" << world << " B=" << batch << " n=" << n << " step=" << step;
        }
        EXPECT_TRUE(shard(plan, 0, plan.steps()).empty()) << "nothing past the last step";
      }
    }
  }
}

TEST(ShardPlan, WRanksOfBatchBEqualOneRankOfBatchWB) {
  for (std::uint32_t world = 1; world <= 4; ++world) {
    const std::uint32_t batch = 5;
    for (bool drop_last : {true, false}) {
      const ShardPlan sharded{103, world, batch, drop_last};
      const ShardPlan single{103, 1, world * batch, drop_last};
      ASSERT_EQ(sharded.steps(), single.steps());
      for (std::uint32_t step = 0; step < sharded.steps(); ++step) {
        Positions all;
        for (std::uint32_t r = 0; r < world; ++r) {
          const Positions mine = shard(sharded, r, step);
          all.insert(all.end(), mine.begin(), mine.end());
        }
        std::sort(all.begin(), all.end());
        EXPECT_EQ(all, shard(single, 0, step)) << "W=" << world << " step=" << step;
      }
    }
  }
}

TEST(ShardPlan, EvaluationCountsEverySampleOnceWithEqualStepsPerRank) {
  for (std::uint32_t world = 1; world <= 5; ++world) {
    for (std::uint32_t n : {1u, 3u, 10000u, 10001u, 10007u}) {
      const ShardPlan plan{n, world, 64, false};
      std::vector<int> count(n, 0);
      for (std::uint32_t step = 0; step < plan.steps(); ++step)
        for (std::uint32_t r = 0; r < world; ++r)
          for (std::uint32_t p : shard(plan, r, step)) ++count[p];
      EXPECT_TRUE(std::all_of(count.begin(), count.end(), [](int c) { return c == 1; }))
          << "W=" << world << " n=" << n;
    }
  }
  // The last step may leave a rank short or empty, but it still has that step.
  const ShardPlan plan{10, 4, 2, false};
  ASSERT_EQ(plan.steps(), 2u);
  EXPECT_EQ(shard(plan, 0, 1), (Positions{8}));
  EXPECT_EQ(shard(plan, 1, 1), (Positions{9}));
  EXPECT_TRUE(shard(plan, 3, 1).empty());
}

TEST(ShardPlan, RejectsMisuse) {
  const ShardPlan plan{100, 2, 4, true};
  Positions out(4);
  EXPECT_THROW(plan.shard(2, 0, out), std::out_of_range);
  Positions small(3);
  EXPECT_THROW(plan.shard(0, 0, small), std::out_of_range);
}

}  // namespace
}  // namespace mnist_mt
