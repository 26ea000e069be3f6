// CPU streams and devices: in-order work, tickets as events, cross-stream waits and
// error propagation, which the trainer's overlap and failure handling rely on.
#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/device.hpp"
#include "cpu/stream.hpp"
#include "mnist_mt/backend.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {
namespace {

using namespace std::chrono_literals;

TEST(Stream, RunsTasksInOrderOffTheCallingThread) {
  Stream s("test");
  std::vector<int> order;
  std::thread::id runner;
  for (int i = 0; i < 100; ++i) {
    s.enqueue([&, i] {
      order.push_back(i);
      runner = std::this_thread::get_id();
    });
  }
  s.synchronize();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(runner, std::this_thread::get_id());
}

TEST(Stream, TicketsCountTasksAndWaitBlocksUntilThatTask) {
  Stream s("test");
  EXPECT_EQ(s.ticket(), 0u);
  std::atomic<bool> release{false};
  std::atomic<int> done{0};
  const auto first = s.enqueue([&] { done = 1; });
  s.enqueue([&] {
    while (!release) std::this_thread::sleep_for(1ms);
    done = 2;
  });
  EXPECT_EQ(first, 1u);
  EXPECT_EQ(s.ticket(), 2u);
  s.wait(first);
  EXPECT_EQ(done.load(), 1);
  release = true;
  s.synchronize();
  EXPECT_EQ(done.load(), 2);
}

TEST(Stream, FirstErrorIsKeptLaterTasksSkippedButComplete) {
  Stream s("test");
  bool ran_after = false;
  s.enqueue([] { throw std::runtime_error("first"); });
  s.enqueue([] { throw std::runtime_error("second"); });
  const auto last = s.enqueue([&] { ran_after = true; });
  try {
    s.wait(last);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first");
  }
  EXPECT_FALSE(ran_after);
  EXPECT_THROW(s.synchronize(), std::runtime_error);  // the error stays
}

TEST(Stream, EnqueueWaitOrdersAgainstAnotherStream) {
  Stream a("a");
  Stream b("b");
  std::atomic<bool> a_done{false};
  bool seen = false;
  a.enqueue([&] {
    std::this_thread::sleep_for(30ms);
    a_done = true;
  });
  b.enqueue_wait(a, a.ticket());
  b.enqueue([&] { seen = a_done.load(); });
  b.synchronize();
  EXPECT_TRUE(seen);
}

TEST(Stream, AnErrorOnTheAwaitedStreamFailsTheWaiterWithAborted) {
  Stream a("a");
  Stream b("b");
  bool ran = false;
  a.enqueue([] { throw RuntimeFailure("boom"); });
  b.enqueue_wait(a, a.ticket());
  b.enqueue([&] { ran = true; });
  EXPECT_THROW(b.synchronize(), Aborted);
  EXPECT_FALSE(ran);
}

TEST(Stream, DestructorDrainsTheQueue) {
  int count = 0;
  {
    Stream s("test");
    for (int i = 0; i < 10; ++i) {
      s.enqueue([&] {
        std::this_thread::sleep_for(1ms);
        ++count;
      });
    }
  }
  EXPECT_EQ(count, 10);
}

TEST(CpuDevice, CommWaitsForComputeAndComputeForComm) {
  CpuDevice d(0);
  EXPECT_EQ(d.name(), "cpu:0");
  std::vector<int> order;  // each task runs only after the previous one, by the waits
  d.compute().enqueue([&] {
    std::this_thread::sleep_for(20ms);
    order.push_back(1);
  });
  d.comm_wait_compute();
  d.comm().enqueue([&] {
    std::this_thread::sleep_for(20ms);
    order.push_back(2);
  });
  d.compute_wait_comm();
  d.compute().enqueue([&] { order.push_back(3); });
  d.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(CpuDevice, SynchronizeDrainsBothStreamsAndReportsTheComputeErrorFirst) {
  CpuDevice d(1);
  bool comm_ran = false;
  d.comm().enqueue([] { throw Aborted("comm"); });
  d.compute().enqueue([] { throw RuntimeFailure("compute"); });
  d.comm().enqueue([&] { comm_ran = true; });
  try {
    d.synchronize();
    FAIL() << "no error";
  } catch (const RuntimeFailure& e) {
    EXPECT_STREQ(e.what(), "compute");
  }
  EXPECT_FALSE(comm_ran);
}

TEST(CpuDevice, WaitComputeLeavesTheCommStreamRunning) {
  CpuDevice d(0);
  std::atomic<bool> release{false};
  d.comm().enqueue([&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  d.compute().enqueue([] {});
  d.wait_compute();  // returns although the comm stream is still busy
  release = true;
  d.synchronize();
}

// Marks are read without waiting: nullopt until the stream gets there, then the moment it
// did, on the host's steady clock, in stream order.
TEST(CpuDevice, MarksAreReadWithoutWaitingOnceTheStreamPassedThem) {
  CpuDevice d(0);
  std::atomic<bool> release{false};
  const auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  const double before = now();
  const TimeMark first = d.mark(Lane::kCompute);
  d.compute().enqueue([&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  const TimeMark second = d.mark(Lane::kCompute);
  const TimeMark comm = d.mark(Lane::kComm);
  d.comm().synchronize();
  EXPECT_TRUE(d.mark_time(comm).has_value()) << "the comm lane does not wait for compute";
  EXPECT_FALSE(d.mark_time(second).has_value());
  EXPECT_FALSE(d.elapsed(first, second).has_value());
  std::this_thread::sleep_for(20ms);
  release = true;
  d.synchronize();
  const double after = now();
  ASSERT_TRUE(d.mark_time(first) && d.mark_time(second));
  EXPECT_GE(*d.mark_time(first), before);
  EXPECT_LE(*d.mark_time(second), after);
  EXPECT_GE(*d.elapsed(first, second), 0.015);
  EXPECT_EQ(*d.elapsed(first, second), *d.mark_time(second) - *d.mark_time(first));
}

TEST(Stream, PassedSaysWhetherATicketCompletedWithoutBlocking) {
  Stream s("test");
  std::atomic<bool> release{false};
  const std::uint64_t t = s.enqueue([&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  EXPECT_FALSE(s.passed(t));
  release = true;
  s.wait(t);
  EXPECT_TRUE(s.passed(t));
}

// The CPUs the calling thread may run on, in order.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(pthread_getaffinity_np(pthread_self(), sizeof set, &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// The CPUs each stream thread of each device may run on: compute, then comm.
std::vector<std::vector<int>> stream_cpus(const std::vector<std::unique_ptr<Device>>& devices) {
  std::vector<std::vector<int>> out;
  for (const auto& d : devices) {
    auto& cpu = dynamic_cast<CpuDevice&>(*d);
    for (Stream* s : {&cpu.compute(), &cpu.comm()}) {
      std::vector<int> cpus;
      s->wait(s->enqueue([&] { cpus = allowed_cpus(); }));
      out.push_back(cpus);
    }
  }
  return out;
}

// Restricts the calling thread to `cpus` for its lifetime (threads it starts inherit it).
class OnlyOn {
 public:
  explicit OnlyOn(const std::vector<int>& cpus) {
    CPU_ZERO(&saved_);
    pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_);
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) CPU_SET(c, &set);
    EXPECT_EQ(pthread_setaffinity_np(pthread_self(), sizeof set, &set), 0);
  }
  ~OnlyOn() { pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_); }
  OnlyOn(const OnlyOn&) = delete;
  OnlyOn& operator=(const OnlyOn&) = delete;

 private:
  cpu_set_t saved_;
};

std::vector<int> ids_for(std::size_t devices) {
  std::vector<int> ids(devices);
  for (std::size_t i = 0; i < devices; ++i) ids[i] = static_cast<int>(i);
  return ids;
}

TEST(CpuDevice, PinnedDevicesRunBothStreamsOnACpuOfTheirOwnWhenTheyAreAsManyAsTheCpus) {
  const std::vector<int> all = allowed_cpus();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(cpu_mask(), all);
  BackendOptions pin;
  pin.pin_cpu_threads = true;

  // A mask of n CPUs (the last n of this thread's, at most 4), as taskset would give.
  const std::size_t n = std::min<std::size_t>(all.size(), 4);
  const std::vector<int> mask(all.end() - static_cast<std::ptrdiff_t>(n), all.end());
  const OnlyOn only(mask);
  EXPECT_EQ(cpu_mask(), mask);
  EXPECT_EQ(cpu_cores_for(n), mask);

  // n devices: device i's two threads on the i-th CPU of the mask.
  const auto pinned = stream_cpus(make_cpu_backend(pin)->make_devices(ids_for(n)));
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(pinned[2 * i], std::vector<int>{mask[i]}) << "device " << i << " compute";
    EXPECT_EQ(pinned[2 * i + 1], std::vector<int>{mask[i]}) << "device " << i << " comm";
  }
  // Unasked, one device more, or one fewer (another run may use the CPU left): every
  // thread may run anywhere in the mask.
  for (const auto& cpus : stream_cpus(make_cpu_backend({})->make_devices(ids_for(n)))) EXPECT_EQ(cpus, mask);
  for (const std::size_t devices : {n + 1, n - 1}) {
    if (devices == 0) continue;
    EXPECT_TRUE(cpu_cores_for(devices).empty()) << devices;
    for (const auto& cpus : stream_cpus(make_cpu_backend(pin)->make_devices(ids_for(devices))))
      EXPECT_EQ(cpus, mask) << devices << " devices";
  }
  EXPECT_TRUE(cpu_cores_for(0).empty());
}

TEST(CpuDevice, ACpuItCannotRunOnLeavesItsThreadsUnpinnedWithAWarning) {
  const std::vector<int> all = allowed_cpus();
  testing::internal::CaptureStderr();
  std::vector<std::unique_ptr<Device>> devices;
  devices.push_back(std::make_unique<CpuDevice>(0, -1));
  const auto cpus = stream_cpus(devices);
  const std::string err = testing::internal::GetCapturedStderr();
  for (const auto& c : cpus) EXPECT_EQ(c, all);
  EXPECT_NE(err.find("mnist_mt: warning: cpu:0 compute runs unpinned: CPU -1: "), std::string::npos) << err;
  EXPECT_NE(err.find("mnist_mt: warning: cpu:0 comm runs unpinned: CPU -1: "), std::string::npos) << err;
}

}  // namespace
}  // namespace mnist_mt::cpu
