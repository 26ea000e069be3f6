// The local group (mnist_mt/local_group.hpp) on CPU devices, the code that serves ranks
// sharing a GPU: every collective gives the CPU communicator's bits, from a thread per
// rank and from one thread in a bracket; an abort releases every rank within a second; a
// mismatched call fails every rank; many rounds under ThreadSanitizer never hang. And the
// device events and operations it is built on.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "mnist_mt/local_group.hpp"
#include "communicator_fixture.hpp"
#include "cpu/communicator.hpp"
#include "cpu/device.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

using namespace std::chrono_literals;
using float_buffers::bitwise_equal;
using float_buffers::random_buffers;
using Buffers = std::vector<std::vector<float>>;

// `world` CPU devices with the local group's communicators (local) or the CPU backend's
// own (its host group: the reference).
struct Ranks : float_buffers::Ranks {
  Ranks(int world, bool local, std::vector<int> shards = {}) {
    std::vector<cpu::CpuDevice*> cpus;
    std::vector<Device*> raw;
    for (int r = 0; r < world; ++r) {
      devices.push_back(std::make_unique<cpu::CpuDevice>(0));
      cpus.push_back(devices.back().get());
      raw.push_back(devices.back().get());
    }
    Place place;
    place.shards = shards;
    comms = local ? make_local_communicators(raw, shards) : cpu::make_communicators(cpus, place);
  }
  int world() const { return static_cast<int>(devices.size()); }

  // op(r) for every rank from this thread, inside a bracket, then every device drained.
  void from_one_thread(const std::function<void(int)>& op) {
    local_group_start();
    for (int r = 0; r < world(); ++r) op(r);
    local_group_end();
    synchronize();
  }
  // op(r) for every rank on a thread of its own, then every device drained.
  void from_a_thread_each(const std::function<void(int)>& op) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world(); ++r) threads.emplace_back([&, r] { op(r); });
    for (auto& t : threads) t.join();
    synchronize();
  }
};

// Runs `op` on the host group and on the local group (both ways of driving it) over copies
// of `original`, and expects the same bits on every rank.
void expect_as_host_group(int world, const Buffers& original, const std::function<void(Ranks&, Buffers&, int)>& op) {
  Buffers expected = original;
  {
    Ranks host(world, false);
    for (int r = 0; r < world; ++r) op(host, expected, r);
    host.synchronize();
  }
  for (bool one_thread : {true, false}) {
    SCOPED_TRACE(one_thread ? "one thread, bracketed" : "a thread each");
    Ranks local(world, true);
    Buffers got = original;
    const auto each = [&](int r) { op(local, got, r); };
    one_thread ? local.from_one_thread(each) : local.from_a_thread_each(each);
    for (int r = 0; r < world; ++r) EXPECT_TRUE(bitwise_equal(got[r], expected[r])) << "rank " << r;
  }
}

TEST(LocalGroup, AllreduceGivesTheHostGroupsBits) {
  for (int world : {1, 2, 3, 4}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{100'003}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        SCOPED_TRACE(testing::Message() << "world " << world << " count " << count << " op " << int(op));
        const Buffers original = random_buffers(world, count, 3 + world);
        // Three ranks or more: another order of additions would give other bits.
        if (world > 2 && count > 1000) {
          Buffers reversed(original.rbegin(), original.rend());
          Ranks a(world, false), b(world, false);
          Buffers x = original, y = reversed;
          for (int r = 0; r < world; ++r) {
            a.comms[r]->allreduce(x[r].data(), count, op);
            b.comms[r]->allreduce(y[r].data(), count, op);
          }
          a.synchronize();
          b.synchronize();
          ASSERT_FALSE(bitwise_equal(x[0], y[0]));
        }
        expect_as_host_group(world, original, [&](Ranks& g, Buffers& b, int r) {
          g.comms[r]->allreduce(b[r].data(), count, op);
        });
      }
    }
  }
}

TEST(LocalGroup, AllreduceOfShardsGivesTheHostGroupsBits) {
  constexpr std::size_t kCount = 5'003;
  for (const std::vector<int>& shards : {std::vector<int>{2, 1, 1}, {1, 3}, {3, 2, 1}}) {
    const int total = std::accumulate(shards.begin(), shards.end(), 0);
    const int world = static_cast<int>(shards.size());
    const Buffers original = random_buffers(total, kCount, 11 + total);
    const auto allreduce = [&](Ranks& g, Buffers& b, int r) {
      std::vector<float*> parts;
      const int first = std::accumulate(shards.begin(), shards.begin() + r, 0);
      for (int s = 0; s < shards[r]; ++s) parts.push_back(b[first + s].data());
      g.comms[r]->allreduce_shards(parts, kCount, ReduceOp::kAverage);
    };
    Buffers expected = original, got = original;
    Ranks host(world, false, shards), local(world, true, shards);
    for (int r = 0; r < world; ++r) allreduce(host, expected, r);
    host.synchronize();
    local.from_a_thread_each([&](int r) { allreduce(local, got, r); });
    for (int r = 0; r < world; ++r) {
      const int last = std::accumulate(shards.begin(), shards.begin() + r + 1, 0) - 1;
      EXPECT_TRUE(bitwise_equal(got[last], expected[last])) << "rank " << r;
    }
  }
}

TEST(LocalGroup, BroadcastReduceScatterAndGatherGiveTheHostGroupsBits) {
  constexpr int kWorld = 3;
  const std::vector<std::size_t> counts{5, 0, 1001};
  const std::size_t total = 1006;
  for (int root = 0; root < kWorld; ++root) {
    SCOPED_TRACE(testing::Message() << "root " << root);
    const Buffers original = random_buffers(kWorld, total, 20 + root);
    expect_as_host_group(kWorld, original, [&](Ranks& g, Buffers& b, int r) {
      g.comms[r]->broadcast(b[r].data(), total, root);
    });
    expect_as_host_group(kWorld, original, [&](Ranks& g, Buffers& b, int r) {
      g.comms[r]->reduce(b[r].data(), total, ReduceOp::kSum, root);
    });
    expect_as_host_group(kWorld, original, [&](Ranks& g, Buffers& b, int r) {
      g.comms[r]->scatter(b[r].data(), counts, root);
    });
    expect_as_host_group(kWorld, original, [&](Ranks& g, Buffers& b, int r) {
      g.comms[r]->gather(b[r].data(), counts, root);
    });
  }
}

TEST(LocalGroup, AllreduceHostSumsInRankOrderEvenInABracket) {
  for (bool one_thread : {true, false}) {
    Ranks g(3, true);
    std::vector<std::vector<double>> values{{1e16, 1.0, 2.0}, {1.0, 2.0, 3.0}, {-1e16, 3.0, 4.0}};
    const auto each = [&](int r) { g.comms[r]->allreduce_host(values[r]); };
    one_thread ? g.from_one_thread(each) : g.from_a_thread_each(each);
    // (1e16 + 1) + -1e16 is 0 in doubles: the sum is in rank order, on every rank.
    for (int r = 0; r < 3; ++r) EXPECT_EQ(values[r], (std::vector<double>{0.0, 6.0, 9.0})) << r;
  }
}

// The last rank to arrive reads every peer's buffer: only after the work each peer
// enqueued before its call, here a slow task writing the buffer on its comm stream.
TEST(LocalGroup, TheReductionWaitsForEveryPeersEarlierWork) {
  constexpr int kWorld = 3;
  constexpr std::size_t kCount = 4096;
  Ranks g(kWorld, true);
  Buffers b(kWorld, std::vector<float>(kCount, 0.0f));
  g.from_one_thread([&](int r) {
    auto* device = dynamic_cast<cpu::CpuDevice*>(g.devices[r].get());
    device->comm().enqueue([&b, r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * (kWorld - r)));
      std::fill(b[r].begin(), b[r].end(), static_cast<float>(r + 1));
    });
    g.comms[r]->allreduce(b[r].data(), kCount, ReduceOp::kSum);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(b[r], std::vector<float>(kCount, 6.0f)) << r;
}

TEST(LocalGroup, AnAbortReleasesEveryWaitingRankWithinASecond) {
  constexpr int kWorld = 4;
  Ranks g(kWorld, true);
  Buffers b(kWorld, std::vector<float>(1000, 1.0f));
  // Rank 3 never arrives: the others wait in the rendezvous, each on its own thread.
  std::vector<std::future<void>> waiting;
  for (int r = 0; r < kWorld - 1; ++r)
    waiting.push_back(std::async(std::launch::async, [&, r] { g.comms[r]->allreduce(b[r].data(), 1000, ReduceOp::kSum); }));
  std::this_thread::sleep_for(50ms);
  for (auto& w : waiting) EXPECT_EQ(w.wait_for(0ms), std::future_status::timeout);
  const auto start = std::chrono::steady_clock::now();
  g.comms[kWorld - 1]->abort();
  for (auto& w : waiting) {
    ASSERT_EQ(w.wait_for(1s), std::future_status::ready);
    EXPECT_THROW(w.get(), Aborted);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  // Later calls fail at once, whoever makes them, and the devices drain.
  EXPECT_THROW(g.comms[kWorld - 1]->broadcast(b[kWorld - 1].data(), 1000, 0), Aborted);
  std::vector<double> host(2, 1.0);
  EXPECT_THROW(g.comms[0]->allreduce_host(host), Aborted);
  g.synchronize();
  g.comms[0]->abort();  // idempotent
}

TEST(LocalGroup, AnAbortReleasesABracketWaitingForPeers) {
  Ranks g(3, true);
  Buffers b(3, std::vector<float>(10, 1.0f));
  auto bracket = std::async(std::launch::async, [&] {
    local_group_start();
    for (int r = 0; r < 2; ++r) g.comms[r]->allreduce(b[r].data(), 10, ReduceOp::kSum);
    local_group_end();  // rank 2 never arrives
  });
  std::this_thread::sleep_for(50ms);
  g.comms[2]->abort();
  ASSERT_EQ(bracket.wait_for(1s), std::future_status::ready);
  EXPECT_THROW(bracket.get(), Aborted);
}

// Whichever rank arrives second finds that the calls differ and fails, naming both; the
// other is released (Aborted). Either may arrive first: a thread's start is not ordered
// by a sleep on a loaded machine.
TEST(LocalGroup, AMismatchedCallFailsItsRankAndReleasesThePeers) {
  Ranks g(2, true);
  Buffers b(2, std::vector<float>(10, 1.0f));
  auto first = std::async(std::launch::async, [&] { g.comms[0]->allreduce(b[0].data(), 10, ReduceOp::kSum); });
  auto second = std::async(std::launch::async, [&] { g.comms[1]->broadcast(b[1].data(), 10, 0); });
  ASSERT_EQ(first.wait_for(1s), std::future_status::ready);
  ASSERT_EQ(second.wait_for(1s), std::future_status::ready);
  int failed = 0, released = 0;
  for (auto* call : {&first, &second}) {
    try {
      call->get();
      ADD_FAILURE() << "a broadcast met an allreduce";
    } catch (const Aborted&) {
      ++released;
    } catch (const RuntimeFailure& e) {
      ++failed;
      const std::string what = e.what();
      EXPECT_NE(what.find("broadcast of 10 floats from root 0"), std::string::npos) << what;
      EXPECT_NE(what.find("allreduce of 10 floats"), std::string::npos) << what;
      EXPECT_NE(what.find("where a peer's is"), std::string::npos) << what;
    }
  }
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(released, 1);
}

// Many rounds of mixed collectives from a thread per rank, with jitter so that every rank
// is sometimes the last to arrive: each round's results are right, and nothing hangs
// (ThreadSanitizer runs this in CI).
TEST(LocalGroup, ManyRoundsOfMixedCollectivesFromAThreadEach) {
  constexpr int kWorld = 3, kRounds = 100;
  constexpr std::size_t kCount = 257;
  Ranks g(kWorld, true);
  Buffers b(kWorld, std::vector<float>(kCount));
  std::vector<long> wrong(kWorld, 0);
  g.from_a_thread_each([&](int r) {
    std::mt19937 rng(static_cast<unsigned>(r));
    for (int round = 0; round < kRounds; ++round) {
      if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
      std::fill(b[r].begin(), b[r].end(), static_cast<float>(r + round));
      g.comms[r]->allreduce(b[r].data(), kCount, ReduceOp::kSum);
      g.comms[r]->broadcast(b[r].data(), kCount, round % kWorld);
      std::vector<double> host{static_cast<double>(r)};
      g.comms[r]->allreduce_host(host);
      g.devices[r]->synchronize();
      const float expected = static_cast<float>(0 + 1 + 2 + kWorld * round);
      wrong[r] += std::count_if(b[r].begin(), b[r].end(), [&](float x) { return x != expected; });
      wrong[r] += host[0] != 3.0;
      // No rank writes its buffer for the next round while a peer may still read it.
      g.comms[r]->barrier();
      g.devices[r]->synchronize();
    }
  });
  EXPECT_EQ(wrong, std::vector<long>(kWorld, 0));
}

// The device operations the group is built on, on CPU devices.
TEST(CpuDeviceOps, AWaitForAnEventOrdersAfterTheOtherDevicesWork) {
  cpu::CpuDevice a(0), b(1);
  std::vector<float> x(100, 0.0f), y(100, 0.0f);
  a.comm().enqueue([&] {
    std::this_thread::sleep_for(30ms);
    std::fill(x.begin(), x.end(), 2.0f);
  });
  const auto event = a.make_event();
  a.record(Lane::kComm, *event);
  b.wait_for(Lane::kComm, *event);
  b.copy(Lane::kComm, y.data(), x.data(), x.size());
  b.synchronize();
  EXPECT_EQ(y, std::vector<float>(100, 2.0f));
  a.synchronize();
}

TEST(CpuDeviceOps, AWaitForAFailedStreamFailsTheWaiter) {
  cpu::CpuDevice a(0), b(1);
  a.comm().enqueue([] { throw RuntimeFailure("broken"); });
  const auto event = a.make_event();
  a.record(Lane::kComm, *event);
  b.wait_for(Lane::kComm, *event);
  EXPECT_THROW(b.synchronize(), Aborted);
  EXPECT_THROW(a.synchronize(), RuntimeFailure);
}

TEST(CpuDeviceOps, ReduceAddsInOrderAndAveragesAsTheHostGroup) {
  // 1e8 + 1 - 1e8 is 0 in floats, in this order; 3 is no power of two: a division.
  std::vector<float> p{1e8f, 3.0f}, q{1.0f, 3.0f}, s{-1e8f, 4.0f}, out(2);
  cpu::CpuDevice d(0);
  const std::vector<const float*> in{p.data(), q.data(), s.data()};
  const std::vector<float*> to{out.data(), p.data()};
  d.reduce(Lane::kComm, in, to, 2, ReduceOp::kAverage, 3);
  d.synchronize();
  EXPECT_EQ(out, (std::vector<float>{0.0f, 10.0f / 3.0f}));
  EXPECT_EQ(p, out);
}

}  // namespace
}  // namespace mnist_mt
