// The in-process communicator: results, bitwise rank-order sums whatever the chunking,
// and abort releasing blocked peers.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "cpu/communicator.hpp"
#include "communicator_fixture.hpp"
#include "cpu/device.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {
namespace {

using namespace std::chrono_literals;

struct Group : float_buffers::Ranks {
  // `shards`: each rank's (Place::shards), or none.
  explicit Group(int world, std::vector<int> shards = {}) {
    std::vector<CpuDevice*> raw;
    for (int r = 0; r < world; ++r) {
      devices.push_back(std::make_unique<CpuDevice>(r));
      raw.push_back(devices.back().get());
    }
    Place place;
    place.shards = std::move(shards);
    comms = make_communicators(raw, place);
  }
  int world() const { return static_cast<int>(devices.size()); }
};

using float_buffers::bitwise_equal;
using float_buffers::random_buffers;

std::vector<float> rank_order_sum(const std::vector<std::vector<float>>& in, bool average) {
  std::vector<float> out = in[0];
  for (std::size_t s = 1; s < in.size(); ++s) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] += in[s][i];
  }
  if (average) {
    for (float& x : out) x /= static_cast<float>(in.size());
  }
  return out;
}


TEST(Communicator, RankAndSize) {
  Group g(3);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(g.comms[r]->rank(), r);
    EXPECT_EQ(g.comms[r]->size(), 3);
  }
}

TEST(Communicator, AllreduceSumAndAverageEqualTheRankOrderSumBitwise) {
  for (int world : {1, 2, 3, 4}) {
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{1000}, std::size_t{100'003}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        SCOPED_TRACE(testing::Message() << "world " << world << " count " << count << " op " << int(op));
        Group g(world);
        auto buffers = random_buffers(world, count, 7 + world);
        const auto expected = rank_order_sum(buffers, op == ReduceOp::kAverage);
        for (int r = 0; r < world; ++r) g.comms[r]->allreduce(buffers[r].data(), count, op);
        g.synchronize();
        for (int r = 0; r < world; ++r) EXPECT_TRUE(bitwise_equal(buffers[r], expected)) << "rank " << r;
      }
    }
  }
}

// The property DDP relies on for --bucket-mb to change nothing: the same elements
// reduced in pieces of any size give the same bits as in one piece.
TEST(Communicator, AllreduceIsBitwiseTheSameWhateverTheBucketing) {
  constexpr std::size_t kCount = 20'000;
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE(testing::Message() << "world " << world);
    const auto original = random_buffers(world, kCount, 42);
    const auto expected = rank_order_sum(original, true);
    // The data must be such that another order of additions gives other bits (with
    // two ranks every order is the same: addition commutes).
    if (world > 2) {
      std::vector<std::vector<float>> reversed(original.rbegin(), original.rend());
      ASSERT_FALSE(bitwise_equal(rank_order_sum(reversed, true), expected));
    }

    for (std::size_t piece : {kCount, std::size_t{13}, std::size_t{1000}, std::size_t{4096 + 3}}) {
      SCOPED_TRACE(testing::Message() << "piece " << piece);
      Group g(world);
      auto buffers = original;
      for (std::size_t begin = 0; begin < kCount; begin += piece) {
        const std::size_t n = std::min(piece, kCount - begin);
        for (int r = 0; r < world; ++r) g.comms[r]->allreduce(buffers[r].data() + begin, n, ReduceOp::kAverage);
      }
      g.synchronize();
      for (int r = 0; r < world; ++r) EXPECT_TRUE(bitwise_equal(buffers[r], expected)) << "rank " << r;
    }
  }
}

// Ranks that compute several shards each (a resumed run on fewer ranks) pass a buffer a
// shard: the result, in each rank's last, is the rank-order sum of a rank per shard, bit for
// bit, as even and uneven blocks go; a rank passing another count fails the collective and
// releases its peers.
TEST(Communicator, AllreduceOfShardsEqualsARankPerShardBitwise) {
  constexpr std::size_t kCount = 5'003;
  for (const std::vector<int>& shards : {std::vector<int>{2, 1, 1}, {2, 2}, {4}, {1, 3}, {3, 2, 1}}) {
    const int total = std::accumulate(shards.begin(), shards.end(), 0);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      SCOPED_TRACE(testing::Message() << shards.size() << " ranks, " << total << " shards, op " << int(op));
      auto buffers = random_buffers(total, kCount, 11 + total);
      const auto expected = rank_order_sum(buffers, op == ReduceOp::kAverage);
      Group g(static_cast<int>(shards.size()), shards);
      int next = 0;
      std::vector<int> last;
      for (std::size_t r = 0; r < shards.size(); ++r) {
        std::vector<float*> parts;
        for (int s = 0; s < shards[r]; ++s) parts.push_back(buffers[static_cast<std::size_t>(next++)].data());
        last.push_back(next - 1);
        g.comms[r]->allreduce_shards(parts, kCount, op);
      }
      g.synchronize();
      for (std::size_t r = 0; r < shards.size(); ++r)
        EXPECT_TRUE(bitwise_equal(buffers[static_cast<std::size_t>(last[r])], expected)) << "rank " << r;
    }
  }
  Group g(2, {2, 1});
  std::vector<float> a(8), c(8);
  g.comms[0]->allreduce_shards(std::vector<float*>{a.data()}, 8, ReduceOp::kSum);
  g.comms[1]->allreduce_shards(std::vector<float*>{c.data()}, 8, ReduceOp::kSum);
  try {
    g.devices[0]->synchronize();
    ADD_FAILURE() << "one buffer for two shards was taken";
  } catch (const RuntimeFailure& e) {
    EXPECT_STREQ(e.what(), "rank 0: an allreduce of 1 buffer for its 2 shards");
  }
  EXPECT_THROW(g.devices[1]->synchronize(), Aborted);
}

// The reduced values' sum of squares (the step's gradient norm): the same bits on every
// rank, the sum of squares of what the ranks hold afterwards, over every allreduce since
// the last take, and reset by the take.
TEST(Communicator, AllreduceKeepsTheResultsSumOfSquaresAlikeOnEveryRank) {
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "world " << world);
    Group g(world);
    auto buffers = random_buffers(world, 30'011, 5);
    for (std::size_t begin : {std::size_t{0}, std::size_t{7}, std::size_t{10'000}}) {
      const std::size_t end = begin == 0 ? 7 : begin == 7 ? 10'000 : 30'011;
      for (int r = 0; r < world; ++r) g.comms[r]->allreduce(buffers[r].data() + begin, end - begin, ReduceOp::kAverage);
    }
    g.synchronize();
    double plain = 0;
    for (float v : buffers[0]) plain += double{v} * v;
    std::vector<double> taken;
    for (int r = 0; r < world; ++r) taken.push_back(g.comms[r]->take_reduced_squares().value_or(-1));
    for (int r = 0; r < world; ++r) EXPECT_EQ(taken[r], taken[0]) << "rank " << r;
    EXPECT_NEAR(taken[0], plain, 1e-12 * plain);
    for (int r = 0; r < world; ++r) EXPECT_EQ(g.comms[r]->take_reduced_squares(), 0.0) << "rank " << r;

    buffers[world - 1][3] = std::numeric_limits<float>::quiet_NaN();
    for (int r = 0; r < world; ++r) g.comms[r]->allreduce(buffers[r].data(), 30'011, ReduceOp::kSum);
    g.synchronize();
    for (int r = 0; r < world; ++r) EXPECT_TRUE(std::isnan(*g.comms[r]->take_reduced_squares())) << "rank " << r;
  }
}

// reduce() keeps its result's sum of squares at the root only.
TEST(Communicator, ReduceKeepsTheResultsSumOfSquaresAtTheRoot) {
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "world " << world);
    Group g(world);
    auto buffers = random_buffers(world, 10'007, 6);
    for (int r = 0; r < world; ++r) g.comms[r]->reduce(buffers[r].data(), 10'007, ReduceOp::kSum, 0);
    g.synchronize();
    double plain = 0;
    for (float v : buffers[0]) plain += double{v} * v;
    EXPECT_NEAR(*g.comms[0]->take_reduced_squares(), plain, 1e-12 * plain);
    for (int r = 1; r < world; ++r) EXPECT_EQ(g.comms[r]->take_reduced_squares(), 0.0) << "rank " << r;
  }
}

TEST(Communicator, AllreduceFromOneHostThreadPerRank) {
  constexpr int kWorld = 4, kRounds = 50;
  constexpr std::size_t kCount = 3000;
  Group g(kWorld);
  std::vector<std::vector<float>> buffers(kWorld, std::vector<float>(kCount));
  std::vector<long> wrong(kWorld, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      for (int round = 0; round < kRounds; ++round) {
        std::fill(buffers[r].begin(), buffers[r].end(), static_cast<float>(r + round));
        g.comms[r]->allreduce(buffers[r].data(), kCount, ReduceOp::kSum);
        g.devices[r]->synchronize();
        const float expected = static_cast<float>(0 + 1 + 2 + 3 + kWorld * round);
        wrong[r] += std::count_if(buffers[r].begin(), buffers[r].end(), [&](float x) { return x != expected; });
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong, std::vector<long>(kWorld, 0));
}

// Every rank's chunk, in rank order, on every rank; `mine` left as it was.
TEST(Communicator, AllgatherGivesEveryRankEveryChunkInRankOrder) {
  for (int world : {1, 2, 3, 4}) {
    Group g(world);
    const std::size_t count = 10'001;
    auto mine = random_buffers(world, count, 7);
    const auto before = mine;
    std::vector<std::vector<float>> all(static_cast<std::size_t>(world),
                                        std::vector<float>(count * static_cast<std::size_t>(world), -1.0f));
    for (int r = 0; r < world; ++r) g.comms[r]->allgather(mine[r].data(), all[r].data(), count);
    g.synchronize();
    std::vector<float> expected;
    for (const auto& m : mine) expected.insert(expected.end(), m.begin(), m.end());
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(bitwise_equal(all[r], expected)) << world << " ranks, rank " << r;
      EXPECT_TRUE(bitwise_equal(mine[r], before[r])) << world << " ranks, rank " << r;
    }
  }
  Group sharded(2, {2, 1});  // ranks of several shards gather nothing: every rank fails alike
  std::vector<float> a(4), b(8);
  for (int r = 0; r < 2; ++r) sharded.comms[r]->allgather(a.data(), b.data(), 4);
  EXPECT_THROW(sharded.synchronize(), std::exception);
  Group unequal(2);  // ranks giving different counts fail, none reading past a peer's buffer
  std::vector<float> c(5), d(10);
  unequal.comms[0]->allgather(c.data(), d.data(), 4);
  unequal.comms[1]->allgather(c.data(), d.data(), 5);
  EXPECT_THROW(unequal.synchronize(), std::exception);
}

TEST(Communicator, BroadcastCopiesRootToEveryRank) {
  for (int world : {1, 2, 4}) {
    for (int root = 0; root < world; ++root) {
      Group g(world);
      auto buffers = random_buffers(world, 10'001, root);
      const auto expected = buffers[root];
      for (int r = 0; r < world; ++r) g.comms[r]->broadcast(buffers[r].data(), expected.size(), root);
      g.synchronize();
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(bitwise_equal(buffers[r], expected)) << world << " " << root << " " << r;
    }
  }
}

TEST(Communicator, ReduceLandsOnRootOnlyInRankOrder) {
  for (int world : {1, 2, 3, 4}) {
    for (int root : {0, world - 1}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        Group g(world);
        auto buffers = random_buffers(world, 20'000, 3 * world + root);
        const auto original = buffers;
        const auto expected = rank_order_sum(buffers, op == ReduceOp::kAverage);
        for (int r = 0; r < world; ++r) g.comms[r]->reduce(buffers[r].data(), expected.size(), op, root);
        g.synchronize();
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(bitwise_equal(buffers[r], r == root ? expected : original[r]))
              << "world " << world << " root " << root << " rank " << r;
        }
      }
    }
  }
}

// Chunks of different sizes (one empty), root anywhere: scatter hands each rank its chunk
// of root's buffer and gather puts them back in place; root's own chunk and the rest of
// every other buffer stay as they were.
TEST(Communicator, ScatterAndGatherMoveEachRanksChunkFromAndToRoot) {
  for (int world : {1, 2, 3}) {
    for (int root : {0, world - 1}) {
      std::vector<std::size_t> counts, offsets;
      std::size_t total = 0;
      for (int r = 0; r < world; ++r) {
        counts.push_back(r == 1 ? 0 : 1000 + 37 * r);
        offsets.push_back(total);
        total += counts.back();
      }
      Group g(world);
      auto buffers = random_buffers(world, total, 7 * world + root);
      const auto before = buffers;
      for (int r = 0; r < world; ++r) g.comms[r]->scatter(buffers[r].data(), counts, root);
      g.synchronize();
      for (int r = 0; r < world; ++r) {
        SCOPED_TRACE(testing::Message() << "scatter: world " << world << " root " << root << " rank " << r);
        std::vector<float> expected = before[r];
        if (r != root)
          std::copy_n(before[root].begin() + offsets[r], counts[r], expected.begin());
        EXPECT_TRUE(bitwise_equal(buffers[r], expected));
      }
      auto sent = random_buffers(world, total, 11 * world + root);
      const auto sent_before = sent;
      for (int r = 0; r < world; ++r) g.comms[r]->gather(sent[r].data(), counts, root);
      g.synchronize();
      std::vector<float> expected = sent_before[root];
      for (int r = 0; r < world; ++r)
        if (r != root) std::copy_n(sent_before[r].begin(), counts[r], expected.begin() + offsets[r]);
      EXPECT_TRUE(bitwise_equal(sent[root], expected)) << "gather: world " << world << " root " << root;
      for (int r = 0; r < world; ++r) {
        if (r == root) continue;
        EXPECT_TRUE(bitwise_equal(sent[r], sent_before[r])) << "gather changed rank " << r;
      }
    }
  }
}

TEST(Communicator, ScatterWithAChunkCountOtherThanTheRanksIsRefused) {
  Group g(2);
  std::vector<float> data(4);
  const std::vector<std::size_t> three{1, 1, 2};
  EXPECT_THROW(g.comms[0]->scatter(data.data(), three, 0), RuntimeFailure);
  const std::vector<std::size_t> two{2, 2};
  EXPECT_THROW(g.comms[0]->gather(data.data(), two, 2), RuntimeFailure);
}

TEST(Communicator, BarrierOrdersWorkAcrossRanks) {
  constexpr int kWorld = 3;
  Group g(kWorld);
  std::vector<int> before(kWorld, 0);
  std::vector<int> seen(kWorld, 0);
  for (int r = 0; r < kWorld; ++r) {
    g.devices[r]->comm().enqueue([&, r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * r));
      before[r] = 1;
    });
    g.comms[r]->barrier();
    g.devices[r]->comm().enqueue([&, r] {
      for (int s = 0; s < kWorld; ++s) seen[r] += before[s];
    });
  }
  g.synchronize();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(seen[r], kWorld);
}

TEST(Communicator, AllreduceHostSumsInRankOrder) {
  constexpr int kWorld = 3;
  Group g(kWorld);
  std::vector<std::vector<double>> values = {{1e16, 1.0, 2.0}, {1.0, 2.0, 3.0}, {-1e16, 3.0, 4.0}};
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] { g.comms[r]->allreduce_host(values[r]); });
  }
  for (auto& t : threads) t.join();
  // (1e16 + 1) + -1e16 is 0 in doubles: the sum is in rank order, on every rank.
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(values[r], (std::vector<double>{0.0, 6.0, 9.0})) << r;
}

TEST(Communicator, AbortReleasesBlockedPeersAndLaterCollectivesThrowAtOnce) {
  constexpr int kWorld = 4;
  Group g(kWorld);
  std::vector<std::vector<float>> buffers(kWorld, std::vector<float>(1000, 1.0f));
  // Rank 3 never joins: the others block in the allreduce.
  for (int r = 0; r < kWorld - 1; ++r) g.comms[r]->allreduce(buffers[r].data(), 1000, ReduceOp::kSum);
  std::this_thread::sleep_for(50ms);
  const auto start = std::chrono::steady_clock::now();
  std::thread aborter([&] { g.comms[kWorld - 1]->abort(); });
  for (int r = 0; r < kWorld - 1; ++r) EXPECT_THROW(g.devices[r]->synchronize(), Aborted) << r;
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);

  // The rank that never joined: its next collective fails at once, the host one too.
  g.comms[kWorld - 1]->broadcast(buffers[kWorld - 1].data(), 1000, 0);
  EXPECT_THROW(g.devices[kWorld - 1]->synchronize(), Aborted);
  std::vector<double> host(2, 1.0);
  EXPECT_THROW(g.comms[0]->allreduce_host(host), Aborted);
  g.comms[0]->abort();  // idempotent
}

TEST(Communicator, AbortBeforeAnyCollective) {
  Group g(2);
  g.comms[1]->abort();
  std::vector<float> x(10, 1.0f);
  g.comms[0]->allreduce(x.data(), x.size(), ReduceOp::kSum);
  g.comms[0]->barrier();
  EXPECT_THROW(g.devices[0]->synchronize(), Aborted);
  EXPECT_EQ(x, std::vector<float>(10, 1.0f));
}

}  // namespace
}  // namespace mnist_mt::cpu
