// The oneTBB loader: every rank receives exactly the batches the sampler plans, in order,
// with the right pixels, labels and indices; it stays a bounded number of batches ahead;
// cancel and errors release every thread, whichever way the ranks are consumed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "data/loader_testing.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/loader.hpp"
#include "mnist_mt/sampler.hpp"

#include "alloc_hook.hpp"

namespace mnist_mt {
namespace {

using namespace std::chrono_literals;

// Sample i's pixels are a pattern of i, its label is i % 10.
Split synthetic_split(std::uint32_t n) {
  Split split;
  split.images.resize(std::size_t{n} * kImageBytes);
  split.labels.resize(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint8_t* image = split.images.data() + std::size_t{i} * kImageBytes;
    for (std::size_t p = 0; p < kImageBytes; ++p) image[p] = static_cast<std::uint8_t>(i * 31 + p * 7 + (i >> 8));
    split.labels[i] = static_cast<std::uint8_t>(i % 10);
  }
  return split;
}

struct Delivered {
  std::uint32_t epoch, step;
  std::vector<std::uint32_t> indices;
};

// Checks a batch against the split and records what it carried.
Delivered check_and_record(const Split& split, const Batch& batch) {
  EXPECT_LE(std::size_t{batch.size}, batch.indices.size());
  EXPECT_EQ(batch.split_images, split.images.data()) << "a GPU gathers the batch from its copy of this split";
  Delivered d{batch.epoch, batch.step, {batch.indices.begin(), batch.indices.begin() + batch.size}};
  for (std::uint32_t i = 0; i < batch.size; ++i) {
    const std::uint32_t index = batch.indices[i];
    EXPECT_LT(index, split.size());
    if (index >= split.size()) continue;
    EXPECT_EQ(batch.labels[i], split.labels[index]);
    EXPECT_EQ(std::memcmp(batch.images.data() + std::size_t{i} * kImageBytes, split.image(index), kImageBytes), 0)
        << "pixels of sample " << index;
  }
  return d;
}

// What rank `rank` must receive: the sampler's plan over the epoch's order.
std::vector<Delivered> planned(const Split& split, const LoaderOptions& o, std::uint32_t rank) {
  const ShardPlan plan{split.size(), o.world, o.batch, o.train};
  std::vector<std::uint32_t> order(split.size());
  if (o.train) {
    order = epoch_permutation(o.seed, o.epoch, split.size());
  } else {
    for (std::uint32_t i = 0; i < split.size(); ++i) order[i] = i;
  }
  std::vector<Delivered> out;
  for (std::uint32_t step = 0; step < plan.steps(); ++step) {
    std::vector<std::uint32_t> positions(o.batch);
    positions.resize(plan.shard(rank, step, positions));
    for (auto& p : positions) p = order[p];
    out.push_back({o.epoch, step, positions});
  }
  return out;
}

void expect_same(const std::vector<Delivered>& got, const std::vector<Delivered>& want, std::uint32_t rank) {
  ASSERT_EQ(got.size(), want.size()) << "rank " << rank;
  for (std::size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].epoch, want[k].epoch) << "rank " << rank << " step " << k;
    EXPECT_EQ(got[k].step, want[k].step) << "rank " << rank << " step " << k;
    EXPECT_EQ(got[k].indices, want[k].indices) << "rank " << rank << " step " << k;
  }
}

// One consumer thread per rank, as the DDP trainer runs.
std::vector<std::vector<Delivered>> consume_ddp(Loader& loader, const Split& split, std::uint32_t world) {
  std::vector<std::vector<Delivered>> got(world);
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      while (const Batch* batch = loader.next(r)) {
        got[r].push_back(check_and_record(split, *batch));
        if (got[r].size() % 3 == r % 3) std::this_thread::yield();  // ranks drift apart
        // The batch stays intact until this rank asks for the next one.
        EXPECT_EQ(check_and_record(split, *batch).indices, got[r].back().indices);
      }
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

// One thread taking every rank's batch in turn, as the DataParallel baseline runs.
std::vector<std::vector<Delivered>> consume_round_robin(Loader& loader, const Split& split, std::uint32_t world) {
  std::vector<std::vector<Delivered>> got(world);
  for (bool more = true; more;) {
    for (std::uint32_t r = 0; r < world; ++r) {
      const Batch* batch = loader.next(r);
      if (batch == nullptr) {
        more = false;
        continue;
      }
      got[r].push_back(check_and_record(split, *batch));
    }
  }
  return got;
}

class LoaderWorld : public ::testing::TestWithParam<std::uint32_t> {};
INSTANTIATE_TEST_SUITE_P(W, LoaderWorld, ::testing::Values(1u, 2u, 3u, 4u));

TEST_P(LoaderWorld, DdpConsumersReceiveExactlyThePlannedTrainingBatches) {
  const Split split = synthetic_split(3000);
  // Small and large batches: the pipeline groups several small steps into one item.
  for (std::uint32_t batch : {7u, 150u}) {
    LoaderOptions o;
    o.world = GetParam();
    o.batch = batch;
    o.seed = 11;
    o.epoch = 2;
    o.depth = 2;
    Loader loader(split, o);
    EXPECT_EQ(loader.steps(), 3000 / (batch * o.world));
    const auto got = consume_ddp(loader, split, o.world);
    for (std::uint32_t r = 0; r < o.world; ++r) expect_same(got[r], planned(split, o, r), r);
    // What a GPU plans from (Replica::plan_epoch): the same samples, from any step on.
    EXPECT_EQ(loader.split_images(), split.images.data());
    for (std::uint32_t r = 0; r < o.world; ++r) {
      for (const std::uint32_t first : {0u, 2u}) {
        std::vector<std::uint32_t> taken;
        for (std::size_t k = first; k < got[r].size(); ++k)
          taken.insert(taken.end(), got[r][k].indices.begin(), got[r][k].indices.end());
        EXPECT_EQ(loader.rank_samples(r, first), taken) << "rank " << r << " from step " << first;
      }
    }
    EXPECT_EQ(loader.next(0), nullptr) << "stays at the end";
  }
}

TEST_P(LoaderWorld, OneThreadConsumingEveryRankInTurn) {
  const Split split = synthetic_split(500);
  LoaderOptions o;
  o.world = GetParam();
  o.batch = 9;
  o.seed = 5;
  o.depth = 1;
  Loader loader(split, o);
  const auto got = consume_round_robin(loader, split, o.world);
  for (std::uint32_t r = 0; r < o.world; ++r) expect_same(got[r], planned(split, o, r), r);
}

TEST_P(LoaderWorld, EvaluationDeliversEverySampleOnceAndEqualStepsPerRank) {
  const Split split = synthetic_split(103);
  LoaderOptions o;
  o.world = GetParam();
  o.batch = 8;
  o.train = false;
  Loader loader(split, o);
  const auto got = consume_ddp(loader, split, o.world);
  std::vector<int> seen(split.size(), 0);
  for (std::uint32_t r = 0; r < o.world; ++r) {
    expect_same(got[r], planned(split, o, r), r);
    EXPECT_EQ(got[r].size(), loader.steps()) << "rank " << r;
    for (const auto& d : got[r])
      for (auto i : d.indices) ++seen[i];
  }
  for (std::uint32_t i = 0; i < split.size(); ++i) EXPECT_EQ(seen[i], 1) << "sample " << i;
}

TEST(Loader, EmptyShardsInTheLastEvaluationStepAreStillDelivered) {
  const Split split = synthetic_split(10);
  LoaderOptions o;
  o.world = 4;
  o.batch = 2;
  o.train = false;
  Loader loader(split, o);
  const auto got = consume_round_robin(loader, split, o.world);
  for (std::uint32_t r = 0; r < 4; ++r) ASSERT_EQ(got[r].size(), 2u) << "rank " << r;
  EXPECT_EQ(got[0][1].indices, (std::vector<std::uint32_t>{8}));
  EXPECT_EQ(got[1][1].indices, (std::vector<std::uint32_t>{9}));
  EXPECT_TRUE(got[2][1].indices.empty());
  EXPECT_TRUE(got[3][1].indices.empty());
}

TEST(Loader, FewerSamplesThanOneGlobalBatchGiveNoTrainingSteps) {
  const Split split = synthetic_split(10);
  LoaderOptions o;
  o.world = 2;
  o.batch = 8;
  Loader loader(split, o);
  EXPECT_EQ(loader.steps(), 0u);
  EXPECT_EQ(loader.next(0), nullptr);
  EXPECT_EQ(loader.next(1), nullptr);
}

TEST(Loader, StaysABoundedNumberOfBatchesAheadAndReusesItsBuffers) {
  const Split split = synthetic_split(5000);
  std::atomic<std::uint32_t> furthest{0};
  LoaderOptions o;
  o.batch = 1;
  o.depth = 3;
  const auto before_gather = [&](std::uint32_t step) {
    std::uint32_t seen = furthest.load();
    while (step > seen && !furthest.compare_exchange_weak(seen, step)) {
    }
  };
  const auto loader = LoaderTesting::with_before_gather(split, o, before_gather);
  ASSERT_NE(loader->next(0), nullptr);
  std::this_thread::sleep_for(100ms);
  // Queue depth + the steps in flight inside the pipeline (at most 8 items of at most 4
  // steps) + the one held: a bound, far below the 5000 steps of the epoch.
  const std::uint32_t bound = o.depth + 8 * 4 + 1;
  EXPECT_LE(furthest.load(), bound);
  std::set<const Batch*> buffers;
  std::uint32_t batches = 1;
  while (const Batch* batch = loader->next(0)) {
    buffers.insert(batch);
    ++batches;
  }
  EXPECT_EQ(batches, 5000u);
  EXPECT_LE(buffers.size(), bound);
}

TEST(Loader, AllocatesNothingPerBatchInSteadyState) {
  const Split split = synthetic_split(3000);
  LoaderOptions o;
  o.world = 2;
  o.batch = 4;
  Loader loader(split, o);
  ASSERT_EQ(loader.steps(), 375u);
  for (int step = 0; step < 20; ++step)
    for (std::uint32_t r = 0; r < o.world; ++r) ASSERT_NE(loader.next(r), nullptr);
  const std::uint64_t before = alloc_hook::count.load();
  for (int step = 20; step < 355; ++step)
    for (std::uint32_t r = 0; r < o.world; ++r)
      if (loader.next(r) == nullptr) FAIL() << "ended early at step " << step;
  EXPECT_EQ(alloc_hook::count.load() - before, 0u) << "allocations while 335 steps were delivered";
}

TEST(Loader, CancelReleasesConsumersWaitingOnAnEmptyQueue) {
  const Split split = synthetic_split(1000);
  std::atomic<bool> stuck{false}, release_pipeline{false};
  LoaderOptions o;
  o.world = 3;
  o.batch = 4;
  const auto before_gather = [&](std::uint32_t step) {
    if (step != 5) return;
    stuck = true;
    while (!release_pipeline.load()) std::this_thread::sleep_for(1ms);
  };
  auto loader = LoaderTesting::with_before_gather(split, o, before_gather);
  std::atomic<int> received{0}, finished{0};
  std::vector<std::thread> consumers;
  for (std::uint32_t r = 0; r < o.world; ++r) {
    consumers.emplace_back([&, r] {
      int batches = 0;
      while (loader->next(r) != nullptr) {
        ++batches;
        ++received;
      }
      EXPECT_LE(batches, 5) << "rank " << r;
      ++finished;
    });
  }
  // Let the consumers take whatever was gathered before step 5, until they wait for more.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!stuck.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  for (int seen = -1; seen != received.load() && std::chrono::steady_clock::now() < deadline;) {
    seen = received.load();
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(finished.load(), 0) << "consumers wait for step 5";
  loader->cancel();
  for (auto& t : consumers) t.join();  // would hang if cancel left a consumer waiting
  EXPECT_EQ(finished.load(), 3);
  EXPECT_EQ(loader->next(1), nullptr) << "cancelled stays cancelled";
  loader->cancel();  // idempotent
  release_pipeline = true;
  loader.reset();
}

TEST(Loader, CancelMidEpochWhileTheHandOffWaitsOnAFullQueue) {
  const Split split = synthetic_split(2000);
  LoaderOptions o;
  o.world = 2;
  o.batch = 3;
  o.depth = 2;
  Loader loader(split, o);
  // Rank 0 consumes a little; rank 1 never does, so the hand-off stage blocks on its queue.
  for (int i = 0; i < 2; ++i) ASSERT_NE(loader.next(0), nullptr);
  std::this_thread::sleep_for(20ms);
  std::thread consumer([&] {
    while (loader.next(0) != nullptr) {
    }
  });
  std::this_thread::sleep_for(20ms);
  loader.cancel();
  consumer.join();
  EXPECT_EQ(loader.next(1), nullptr);
}

TEST(Loader, DestroyingMidEpochStopsThePipeline) {
  const Split split = synthetic_split(2000);
  for (std::uint32_t world : {1u, 4u}) {
    LoaderOptions o;
    o.world = world;
    o.batch = 2;
    o.depth = 1;
    Loader loader(split, o);
    ASSERT_NE(loader.next(0), nullptr);
    // Leaves with the queues full and the hand-off stage blocked.
  }
}

TEST(Loader, AStageErrorReachesEveryDdpConsumer) {
  const Split split = synthetic_split(1000);
  LoaderOptions o;
  o.world = 3;
  o.batch = 5;
  const auto before_gather = [](std::uint32_t step) {
    if (step == 7) throw std::runtime_error("gather failed at step 7");
  };
  const auto loader = LoaderTesting::with_before_gather(split, o, before_gather);
  std::vector<std::thread> consumers;
  std::atomic<int> errors{0};
  for (std::uint32_t r = 0; r < o.world; ++r) {
    consumers.emplace_back([&, r] {
      try {
        std::uint32_t batches = 0;
        while (const Batch* batch = loader->next(r)) {
          EXPECT_LT(batch->step, 7u);
          ++batches;
        }
        ADD_FAILURE() << "rank " << r << " ended after " << batches << " batches without the error";
      } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "gather failed at step 7");
        ++errors;
      }
      EXPECT_THROW(loader->next(r), std::runtime_error) << "the error is sticky";
    });
  }
  for (auto& t : consumers) t.join();
  EXPECT_EQ(errors.load(), 3);
}

TEST(Loader, AStageErrorReachesARoundRobinConsumer) {
  const Split split = synthetic_split(200);
  LoaderOptions o;
  o.world = 2;
  o.batch = 4;
  const auto before_gather = [](std::uint32_t step) {
    if (step == 3) throw InputError("bad sample");
  };
  const auto loader = LoaderTesting::with_before_gather(split, o, before_gather);
  EXPECT_THROW(consume_round_robin(*loader, split, o.world), InputError);
}

TEST(Loader, RejectsInvalidOptions) {
  const Split split = synthetic_split(10);
  LoaderOptions o;
  o.world = 0;
  EXPECT_THROW((Loader{split, o}), InputError);
  o.world = 1;
  o.batch = 0;
  EXPECT_THROW((Loader{split, o}), InputError);
  o.batch = 1;
  o.depth = 0;
  EXPECT_THROW((Loader{split, o}), InputError);
  Loader loader(split, LoaderOptions{});
  EXPECT_THROW(loader.next(1), std::out_of_range);
}

}  // namespace
}  // namespace mnist_mt
