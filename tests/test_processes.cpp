// The CPU communicator across processes (HostGroup's hierarchical collectives), with the
// processes played by groups of threads in this process: a Processes whose exchanges
// meet in memory. Results bitwise as the design says (each process's rank-order sum,
// then the processes' sums in process order), every rank of every process alike, and an
// abort releasing a rank that waits for a process that never comes. tests/test_mpi.cpp
// runs the same code between real processes under mpirun.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/communicator.hpp"
#include "communicator_fixture.hpp"
#include "cpu/device.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/processes.hpp"
#include "mnist_mt/local_devices.hpp"

namespace mnist_mt::cpu {
namespace {

using namespace std::chrono_literals;

// Where the pretend processes' exchanges meet: one allgather at a time, in two phases
// (every process deposits, then every process has copied) so that a slot is never
// overwritten while a peer reads it.
struct Meeting {
  explicit Meeting(int processes) : slots(processes), hosts(processes, "localhost") {}
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::vector<char>> slots;
  std::vector<std::string> hosts;
  int deposited = 0, copied = 0;
  std::uint64_t round = 0;
  std::atomic<int> waiting{0};  // processes inside an exchange
};

class ThreadProcesses final : public Processes {
 public:
  ThreadProcesses(std::shared_ptr<Meeting> meeting, int index) : meeting_(std::move(meeting)), index_(index) {}
  int index() const override { return index_; }
  int count() const override { return static_cast<int>(meeting_->slots.size()); }
  const std::string& host(int process) const override { return meeting_->hosts.at(static_cast<std::size_t>(process)); }

  void allgather(const void* mine, void* all, std::size_t bytes, const std::function<bool()>& stop) override {
    Meeting& m = *meeting_;
    ++m.waiting;
    struct Leave {
      Meeting& m;
      ~Leave() { --m.waiting; }
    } leave{m};
    std::unique_lock lock(m.mutex);
    const auto p = static_cast<std::size_t>(index_);
    m.slots[p].assign(static_cast<const char*>(mine), static_cast<const char*>(mine) + bytes);
    const std::uint64_t round = m.round;
    ++m.deposited;
    m.cv.notify_all();
    wait(lock, stop, [&] { return m.deposited == count() || m.round != round; });
    for (int q = 0; q < count(); ++q)
      std::memcpy(static_cast<char*>(all) + bytes * static_cast<std::size_t>(q), m.slots[static_cast<std::size_t>(q)].data(), bytes);
    if (++m.copied == count()) {
      m.deposited = m.copied = 0;
      ++m.round;
      m.cv.notify_all();
    }
    wait(lock, stop, [&] { return m.round != round; });
  }

  void broadcast(void* data, std::size_t bytes, int root, const std::function<bool()>& stop) override {
    std::vector<char> all(bytes * static_cast<std::size_t>(count()));
    allgather(data, all.data(), bytes, stop);
    std::memcpy(data, all.data() + bytes * static_cast<std::size_t>(root), bytes);
  }

  std::vector<int> waiting_for() const override { return {}; }
  [[noreturn]] void abort(int) override { std::abort(); }

 private:
  template <typename Ready>
  void wait(std::unique_lock<std::mutex>& lock, const std::function<bool()>& stop, Ready ready) {
    while (!ready()) {
      if (stop()) throw Aborted("exchange released");
      meeting_->cv.wait_for(lock, 1ms);
    }
  }

  std::shared_ptr<Meeting> meeting_;
  int index_;
};

// P pretend processes of L CPU ranks each: world rank p*L + l is process p's rank l.
struct World : float_buffers::Ranks {
  World(int processes, int ranks) : per(ranks), meeting(std::make_shared<Meeting>(processes)) {
    for (int p = 0; p < processes; ++p) {
      Place place;
      place.processes = std::make_shared<ThreadProcesses>(meeting, p);
      place.first_rank = p * ranks;
      place.world = processes * ranks;
      std::vector<CpuDevice*> raw;
      for (int l = 0; l < ranks; ++l) {
        devices.push_back(std::make_unique<CpuDevice>(l));
        raw.push_back(devices.back().get());
      }
      for (auto& c : make_communicators(raw, place)) comms.push_back(std::move(c));
    }
  }
  int size() const { return static_cast<int>(comms.size()); }
  int per;
  std::shared_ptr<Meeting> meeting;
};

using float_buffers::bitwise_equal;
using float_buffers::random_buffers;

// Each process's rank-order sum, then those sums in process order, / W for an average.
std::vector<float> hierarchical_sum(const std::vector<std::vector<float>>& in, int per, bool average) {
  std::vector<float> out(in[0].size(), 0.0f);
  const int processes = static_cast<int>(in.size()) / per;
  for (int p = 0; p < processes; ++p) {
    std::vector<float> local = in[static_cast<std::size_t>(p * per)];
    for (int l = 1; l < per; ++l) {
      for (std::size_t i = 0; i < local.size(); ++i) local[i] += in[static_cast<std::size_t>(p * per + l)][i];
    }
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = p == 0 ? local[i] : out[i] + local[i];
  }
  if (average) {
    for (float& x : out) x /= static_cast<float>(in.size());
  }
  return out;
}


TEST(Processes, RanksAreNumberedProcessMajor) {
  World w(3, 2);
  for (int r = 0; r < w.size(); ++r) {
    EXPECT_EQ(w.comms[static_cast<std::size_t>(r)]->rank(), r);
    EXPECT_EQ(w.comms[static_cast<std::size_t>(r)]->size(), 6);
  }
}

TEST(Processes, AllreduceAddsEachProcesssSumInProcessOrderOnEveryRank) {
  for (const auto& [processes, per] : {std::pair{2, 1}, std::pair{3, 1}, std::pair{2, 2}, std::pair{2, 3}}) {
    for (const std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{100'003}}) {
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        SCOPED_TRACE(testing::Message() << processes << " x " << per << " count " << count << " op " << int(op));
        World w(processes, per);
        auto buffers = random_buffers(w.size(), count, 11 + static_cast<unsigned>(count));
        const auto expected = hierarchical_sum(buffers, per, op == ReduceOp::kAverage);
        // The data tells this order from the plain rank order where they differ.
        if (per > 1 && count >= 1000) {
          ASSERT_FALSE(bitwise_equal(expected, hierarchical_sum(buffers, w.size(), op == ReduceOp::kAverage)));
        }
        for (int r = 0; r < w.size(); ++r)
          w.comms[static_cast<std::size_t>(r)]->allreduce(buffers[static_cast<std::size_t>(r)].data(), count, op);
        w.synchronize();
        std::vector<double> squares;
        for (int r = 0; r < w.size(); ++r) {
          EXPECT_TRUE(bitwise_equal(buffers[static_cast<std::size_t>(r)], expected)) << "rank " << r;
          squares.push_back(*w.comms[static_cast<std::size_t>(r)]->take_reduced_squares());
        }
        for (const double s : squares) EXPECT_EQ(s, squares[0]);  // the same bits everywhere
        double direct = 0;
        for (const float x : expected) direct += double{x} * x;
        EXPECT_NEAR(squares[0], direct, 1e-9 * direct);
      }
    }
  }
}

// One rank per process adds in the order one process with every rank does.
TEST(Processes, OneRankPerProcessSumsAsOneProcessWithEveryRank) {
  World w(3, 1);
  auto buffers = random_buffers(3, 5000, 5);
  std::vector<float> expected = buffers[0];
  for (std::size_t s = 1; s < 3; ++s) {
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] += buffers[s][i];
  }
  for (float& x : expected) x /= 3.0f;
  for (int r = 0; r < 3; ++r) w.comms[static_cast<std::size_t>(r)]->allreduce(buffers[static_cast<std::size_t>(r)].data(), 5000, ReduceOp::kAverage);
  w.synchronize();
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(bitwise_equal(buffers[static_cast<std::size_t>(r)], expected)) << r;
}

TEST(Processes, BroadcastFromWorldRankZeroReachesEveryProcess) {
  World w(2, 2);
  std::vector<std::vector<float>> buffers(4, std::vector<float>(3000, 0.0f));
  for (std::size_t i = 0; i < 3000; ++i) buffers[0][i] = static_cast<float>(i) * 0.5f;
  for (int r = 0; r < 4; ++r) w.comms[static_cast<std::size_t>(r)]->broadcast(buffers[static_cast<std::size_t>(r)].data(), 3000, 0);
  w.synchronize();
  for (int r = 1; r < 4; ++r) EXPECT_EQ(buffers[static_cast<std::size_t>(r)], buffers[0]) << r;
}

TEST(Processes, AllreduceHostSumsEachProcessThenTheProcessesInOrder) {
  World w(2, 2);
  const std::vector<std::vector<double>> in = {{1e16, 1.0}, {1.0, 2.0}, {-1e16, 3.0}, {3.0, 4.0}};
  std::vector<double> expected(2), rank_order(2);
  for (std::size_t i = 0; i < 2; ++i) {
    expected[i] = (in[0][i] + in[1][i]) + (in[2][i] + in[3][i]);
    rank_order[i] = ((in[0][i] + in[1][i]) + in[2][i]) + in[3][i];
  }
  ASSERT_NE(expected[0], rank_order[0]);  // the data tells the two orders apart
  auto values = in;
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] { w.comms[static_cast<std::size_t>(r)]->allreduce_host(values[static_cast<std::size_t>(r)]); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(values[static_cast<std::size_t>(r)], expected) << r;
}

TEST(Processes, ReduceScatterAndGatherStayInOneProcess) {
  World w(2, 1);
  std::vector<float> x(4, 1.0f);
  w.comms[0]->reduce(x.data(), x.size(), ReduceOp::kSum, 0);
  EXPECT_THROW(w.devices[0]->synchronize(), RuntimeFailure);
}

// Process 1 never joins: process 0's ranks wait, rank 0 in the exchange, until their
// group is aborted (a failed rank, the watchdog), then leave at once.
TEST(Processes, AnAbortReleasesARankWaitingForAnotherProcess) {
  World w(2, 2);
  std::vector<std::vector<float>> buffers(2, std::vector<float>(1000, 1.0f));
  for (int r = 0; r < 2; ++r) w.comms[static_cast<std::size_t>(r)]->allreduce(buffers[static_cast<std::size_t>(r)].data(), 1000, ReduceOp::kSum);
  // Process 0's rank 0 waits inside the exchange (not at a barrier of its own process).
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (w.meeting->waiting.load() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(w.meeting->waiting.load(), 1);
  const auto start = std::chrono::steady_clock::now();
  w.comms[1]->abort();
  for (int r = 0; r < 2; ++r) EXPECT_THROW(w.devices[static_cast<std::size_t>(r)]->synchronize(), Aborted) << r;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

// The local-rank rule (mnist_mt/local_devices.hpp): the processes of a host split their
// --gpus list in process order; processes of a host never share a GPU.
using Lists = std::vector<std::vector<int>>;

std::string names(const std::vector<int>& which) {
  std::string text;
  for (const int p : which) text += (text.empty() ? "process " : ", process ") + std::to_string(p);
  return text;
}

// Every process's share, or the error every process finds alike.
Lists shares(const std::vector<std::string>& hosts, const Lists& lists) { return launch_shares(hosts, lists, names); }

std::string refusal(const std::vector<std::string>& hosts, const Lists& lists) {
  try {
    shares(hosts, lists);
  } catch (const SameOnEveryProcess& e) {
    EXPECT_EQ(e.input(), "gpus");
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(LocalDevices, LocalRankCountsTheProcessesOfOneHostInProcessOrder) {
  const std::vector<std::string> hosts = {"a", "b", "a", "a", "b"};
  const int expected[][2] = {{0, 3}, {0, 2}, {1, 3}, {2, 3}, {1, 2}};
  for (int p = 0; p < 5; ++p) {
    const LocalRank r = local_rank(hosts, p);
    EXPECT_EQ(r.index, expected[p][0]) << p;
    EXPECT_EQ(r.count, expected[p][1]) << p;
  }
}

TEST(LocalDevices, OneProcessKeepsItsList) {
  const std::vector<int> listed = {3, 1, 2};
  EXPECT_EQ(devices_for_local_rank(listed, 0, 1), listed);
  EXPECT_EQ(shares({"a"}, {listed}), Lists{listed});
}

TEST(LocalDevices, TwoProcessesOnOneHostSplitTheListInOrder) {
  EXPECT_EQ(shares({"a", "a"}, {{0, 1}, {0, 1}}), (Lists{{0}, {1}}));
  EXPECT_EQ(shares({"a", "a"}, {{0, 1, 2, 3}, {0, 1, 2, 3}}), (Lists{{0, 1}, {2, 3}}));  // the README's example
  EXPECT_EQ(shares({"a", "a"}, {{3, 2}, {3, 2}}), (Lists{{3}, {2}}));  // the list's order, not the numbers'
}

TEST(LocalDevices, FourProcessesOnTwoHostsSplitEachHostsList) {
  // Blocks (mpirun's default) and round robin (srun --distribution=cyclic).
  EXPECT_EQ(shares({"a", "a", "b", "b"}, Lists(4, {0, 1, 2, 3})), (Lists{{0, 1}, {2, 3}, {0, 1}, {2, 3}}));
  EXPECT_EQ(shares({"a", "b", "a", "b"}, Lists(4, {0, 1})), (Lists{{0}, {0}, {1}, {1}}));
}

TEST(LocalDevices, AListThatDoesNotSplitIsRefusedNamingItsHostAndProcesses) {
  EXPECT_THROW(devices_for_local_rank(std::vector<int>{0, 1, 2}, 0, 2), InputError);
  EXPECT_EQ(refusal({"a", "b", "b"}, Lists(3, {0, 1, 2})),
            "GPUs 0,1,2 do not split evenly among 2 processes on host b (process 1, process 2): each process of a "
            "host takes an equal share of the list, in order");
  // One process per host keeps any list.
  EXPECT_EQ(shares({"a", "b"}, Lists(2, {0, 1, 2})), Lists(2, {0, 1, 2}));
}

TEST(LocalDevices, ProcessesOfOneHostGivenOverlappingListsAreRefused) {
  // Process 0 takes the first half of 2,3,0,1 and process 1 the second of 0,1,2,3.
  EXPECT_EQ(refusal({"a", "a"}, {{2, 3, 0, 1}, {0, 1, 2, 3}}),
            "process 0, process 1 both take GPU 2: the processes of a host need the same list (each takes its "
            "share) or lists that do not overlap");
  // Lists of their own that do not overlap are fine, of any lengths that split.
  EXPECT_EQ(shares({"a", "a"}, {{0, 1}, {4, 5, 2, 3}}), (Lists{{0}, {2, 3}}));
}

TEST(LocalDevices, TheSameGpuNumbersOnDifferentHostsAreNoClash) {
  EXPECT_EQ(shares({"a", "b"}, {{0}, {0}}), (Lists{{0}, {0}}));
  EXPECT_FALSE(find_clash(std::vector<std::string>{"a", "b"}, Lists{{0, 1}, {1, 0}}));
  const auto clash = find_clash(std::vector<std::string>{"a", "b", "a"}, Lists{{0, 1}, {1}, {1}});
  ASSERT_TRUE(clash);
  EXPECT_EQ(clash->first, 0);
  EXPECT_EQ(clash->second, 2);
  EXPECT_EQ(clash->device, 1);
}

TEST(LocalDevices, ProcessesOnCpusTakeNoGpu) {
  EXPECT_EQ(shares({"a", "a", "a"}, {{}, {}, {}}), Lists(3));
}

}  // namespace
}  // namespace mnist_mt::cpu
