// The CUDA communicators, each rank on its own thread as the trainer runs them, in two
// layouts: NCCL over every visible GPU, and three ranks sharing GPU 0 (the local group,
// src/comm): allreduce, broadcast, reduce, barrier and allreduce_host against results
// computed on the host, one thread driving every rank, abort() releasing ranks that wait
// for a peer, and ranks sharing the GPU summing the bits CPU ranks sum. Needs a GPU
// (gpu_main.cpp); the error test runs everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mnist_mt/local_group.hpp"
#include "cpu/communicator.hpp"
#include "cpu/device.hpp"
#include "mnist_mt/backend.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt {
namespace {

using namespace std::chrono_literals;

int gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void check(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
}

// A test's buffer on the current device, with host copies in and out.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& values) : count_(values.size()) {
    void* raw = nullptr;
    check(cudaMalloc(&raw, count_ * sizeof(float)));
    data_ = static_cast<float*>(raw);
    // On a stream of its own, waited for: the data has landed before any collective is
    // enqueued. Not cudaDeviceSynchronize(), which on a GPU shared by ranks would wait
    // for a peer's collective, itself waiting for this rank.
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const cudaError_t copied = cudaMemcpyAsync(data_, values.data(), count_ * sizeof(float), cudaMemcpyHostToDevice, stream);
    const cudaError_t waited = cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    check(copied);
    check(waited);
  }
  ~DeviceFloats() { cudaFree(data_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* data() { return data_; }
  std::vector<float> read() const {
    std::vector<float> out(count_);
    check(cudaMemcpy(out.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  float* data_ = nullptr;
  std::size_t count_;
};

// Device ids of a layout: every visible GPU (one NCCL communicator each), or three ranks
// on GPU 0 (the local group).
std::vector<int> all_gpus() {
  std::vector<int> ids(static_cast<std::size_t>(gpu_count()));
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}
const std::vector<int> kSharedGpu{0, 0, 0};

struct Group {
  explicit Group(const std::vector<int>& ids) : backend(make_cuda_backend({})) {
    devices = backend->make_devices(ids);
    std::vector<Device*> raw;
    for (auto& d : devices) raw.push_back(d.get());
    const bool shared = std::set<int>(ids.begin(), ids.end()).size() != ids.size();
    comms = shared ? make_local_communicators(raw) : backend->make_communicators(raw);
  }
  int world() const { return static_cast<int>(devices.size()); }

  // fn(rank) on a thread per rank with its device active, as the trainer's workers run;
  // rethrows the first rank's error.
  void on_every_rank(const std::function<void(int)>& fn) {
    std::vector<std::exception_ptr> errors(devices.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < world(); ++r) {
      threads.emplace_back([&, r] {
        try {
          devices[r]->activate();
          fn(r);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  std::unique_ptr<Backend> backend;
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::unique_ptr<Communicator>> comms;
};

class CudaComm : public testing::TestWithParam<bool> {  // true: ranks share GPU 0
 protected:
  std::vector<int> ids() const { return GetParam() ? kSharedGpu : all_gpus(); }
};

// Small integers: every sum is exact in fp32, whatever order NCCL adds in.
constexpr std::size_t kCount = 1000003;  // not a multiple of any chunk size
std::vector<float> rank_values(int rank, std::size_t count) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
  return v;
}
float sum_over_ranks(int world, std::size_t i) { return static_cast<float>(world * (world + 1) / 2 * (i % 7 + 1)); }

// Also a count over a whole gradient.
TEST_P(CudaComm, AllreduceSumsOverEveryGpu) {
  Group g(ids());
  for (const std::size_t count : {kCount, 3 * kParamCount + 5}) {
    g.on_every_rank([&](int r) {
      DeviceFloats buf(rank_values(r, count));
      g.comms[r]->allreduce(buf.data(), count, ReduceOp::kSum);
      g.devices[r]->synchronize();
      const std::vector<float> got = buf.read();
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(got[i], sum_over_ranks(g.world(), i)) << "rank " << r << " at " << i << " of " << count;
    });
  }
}

TEST_P(CudaComm, AllreduceAverages) {
  Group g(ids());
  g.on_every_rank([&](int r) {
    DeviceFloats buf(rank_values(r, kCount));
    g.comms[r]->allreduce(buf.data(), kCount, ReduceOp::kAverage);
    g.devices[r]->synchronize();
    const std::vector<float> got = buf.read();
    for (std::size_t i = 0; i < kCount; ++i) {
      const float want = sum_over_ranks(g.world(), i) / static_cast<float>(g.world());
      ASSERT_NEAR(got[i], want, 1e-6f * want) << "rank " << r << " at " << i;
    }
  });
}

TEST_P(CudaComm, BroadcastCopiesTheRootsBuffer) {
  Group g(ids());
  const int root = g.world() - 1;
  g.on_every_rank([&](int r) {
    DeviceFloats buf(rank_values(r, kCount));
    g.comms[r]->broadcast(buf.data(), kCount, root);
    g.devices[r]->synchronize();
    EXPECT_EQ(buf.read(), rank_values(root, kCount)) << "rank " << r;
  });
}

TEST_P(CudaComm, ReduceLandsOnTheRootOnly) {
  Group g(ids());
  g.on_every_rank([&](int r) {
    DeviceFloats buf(rank_values(r, kCount));
    g.comms[r]->reduce(buf.data(), kCount, ReduceOp::kSum, 0);
    g.devices[r]->synchronize();
    const std::vector<float> got = buf.read();
    if (r != 0) {
      EXPECT_EQ(got, rank_values(r, kCount)) << "rank " << r;
      return;
    }
    for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i], sum_over_ranks(g.world(), i)) << "at " << i;
  });
}

TEST_P(CudaComm, AllreduceHostSumsDoubles) {
  Group g(ids());
  g.on_every_rank([&](int r) {
    std::vector<double> values(300);  // more than one pass through the device scratch
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5 * (r + 1) + static_cast<double>(i);
    g.comms[r]->allreduce_host(values);
    const int w = g.world();
    for (std::size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(values[i], 0.25 * w * (w + 1) + static_cast<double>(w) * static_cast<double>(i)) << "at " << i;
  });
}

TEST_P(CudaComm, BarrierCompletesOnEveryRank) {
  Group g(ids());
  g.on_every_rank([&](int r) {
    EXPECT_EQ(g.comms[r]->rank(), r);
    EXPECT_EQ(g.comms[r]->size(), g.world());
    g.comms[r]->barrier();
    g.devices[r]->synchronize();
  });
}

// One thread issues every rank's collective, as the DataParallel baseline does: inside
// one group, NCCL's and the local group's.
TEST_P(CudaComm, OneThreadDrivesEveryRank) {
  Group g(ids());
  std::vector<std::unique_ptr<DeviceFloats>> bufs;
  for (int r = 0; r < g.world(); ++r) {
    g.devices[r]->activate();
    bufs.push_back(std::make_unique<DeviceFloats>(rank_values(r, kCount)));
  }
  g.backend->group_start();
  local_group_start();
  for (int r = 0; r < g.world(); ++r) {
    g.devices[r]->activate();
    g.comms[r]->allreduce(bufs[r]->data(), kCount, ReduceOp::kSum);
  }
  local_group_end();
  g.backend->group_end();
  for (int r = 0; r < g.world(); ++r) {
    g.devices[r]->activate();
    g.devices[r]->synchronize();
    const std::vector<float> got = bufs[r]->read();
    for (std::size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(got[i], sum_over_ranks(g.world(), i)) << "rank " << r << " at " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaComm, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "SharedGpu" : "Nccl"; });

// Ranks that share the GPU add in rank order, as CPU ranks do: the same bits, for a sum
// and for averages by three (a division) and by four (a multiplication by the inverse),
// on values whose order of additions shows in the bits.
TEST(CudaCommSharedGpu, SumsTheBitsCpuRanksSum) {
  constexpr std::size_t kValues = 100'003;
  for (int world : {3, 4}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      SCOPED_TRACE(testing::Message() << world << " ranks, op " << int(op));
      std::mt19937 rng(static_cast<unsigned>(world));
      std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
      std::uniform_int_distribution<int> exponent(-12, 12);
      std::vector<std::vector<float>> values(static_cast<std::size_t>(world), std::vector<float>(kValues));
      for (auto& v : values)
        for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng));

      std::vector<std::vector<float>> on_cpu = values;
      {
        std::vector<std::unique_ptr<cpu::CpuDevice>> cpus;
        std::vector<cpu::CpuDevice*> raw;
        for (int r = 0; r < world; ++r) {
          cpus.push_back(std::make_unique<cpu::CpuDevice>(r));
          raw.push_back(cpus.back().get());
        }
        const auto comms = cpu::make_communicators(raw, {});
        for (int r = 0; r < world; ++r) comms[r]->allreduce(on_cpu[r].data(), kValues, op);
        for (auto& d : cpus) d->synchronize();
      }

      Group g(std::vector<int>(static_cast<std::size_t>(world), 0));
      std::vector<std::unique_ptr<DeviceFloats>> bufs;
      for (int r = 0; r < world; ++r) {
        g.devices[r]->activate();
        bufs.push_back(std::make_unique<DeviceFloats>(values[r]));
      }
      g.on_every_rank([&](int r) {
        g.comms[r]->allreduce(bufs[r]->data(), kValues, op);
        g.devices[r]->synchronize();
      });
      for (int r = 0; r < world; ++r) {
        g.devices[r]->activate();
        const std::vector<float> got = bufs[r]->read();
        EXPECT_EQ(std::memcmp(got.data(), on_cpu[r].data(), kValues * sizeof(float)), 0) << "rank " << r;
      }
    }
  }
}

// Counts the threads that have finished, without join(): a thread stuck in a collective
// must fail the test, not hang it in a destructor.
class Finished {
 public:
  void one() {
    const std::lock_guard lock(mutex_);
    ++count_;
    cv_.notify_all();
  }
  bool wait_for(int count, std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, limit, [&] { return count_ >= count; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_ = 0;
};

// A rank that never joins (as if it failed) must not leave its peers waiting: abort()
// releases them with Aborted, may be called again, and refuses later collectives. NCCL
// needs two GPUs for it; three ranks sharing GPU 0 run it on any GPU host.
void expect_abort_releases_waiting_ranks(const std::vector<int>& ids) {
  SCOPED_TRACE(ids == kSharedGpu ? "ranks sharing GPU 0" : "NCCL");
  // Shared with the waiting threads, which keep it alive if one of them never finishes.
  struct State {
    explicit State(const std::vector<int>& ids) : g(ids), errors(g.devices.size()) {}
    Group g;
    std::vector<std::exception_ptr> errors;
    Finished finished;
  };
  auto state = std::make_shared<State>(ids);
  Group& g = state->g;
  for (int r = 1; r < g.world(); ++r) {
    std::thread([state, r] {
      try {
        state->g.devices[r]->activate();
        DeviceFloats buf(rank_values(r, kCount));
        state->g.comms[r]->allreduce(buf.data(), kCount, ReduceOp::kSum);
        state->g.devices[r]->synchronize();
      } catch (...) {
        state->errors[r] = std::current_exception();
      }
      state->finished.one();
    }).detach();
  }
  std::this_thread::sleep_for(500ms);
  g.comms[0]->abort();
  g.comms[0]->abort();
  ASSERT_TRUE(state->finished.wait_for(g.world() - 1, 20s)) << "a rank is still waiting 20 s after abort()";
  for (int r = 1; r < g.world(); ++r) {
    ASSERT_TRUE(state->errors[r]) << "rank " << r << " finished its allreduce without rank 0";
    EXPECT_THROW(std::rethrow_exception(state->errors[r]), Aborted) << "rank " << r;
  }
  g.devices[1]->activate();
  DeviceFloats buf(rank_values(1, 16));
  EXPECT_THROW(g.comms[1]->allreduce(buf.data(), 16, ReduceOp::kSum), Aborted);
}

TEST(CudaCommAbort, ReleasesRanksWaitingForAPeer) {
  expect_abort_releases_waiting_ranks(kSharedGpu);
  if (gpu_count() >= 2) expect_abort_releases_waiting_ranks(all_gpus());
}

// Runs with or without a GPU: a failed call names itself and where it was made.
TEST(CudaCommAnywhere, FailedCallReportsTheCallAndThePlace) {
  auto backend = make_cuda_backend({});
  const int absent[] = {gpu_count() + 1000};
  try {
    backend->make_devices(absent);
    FAIL() << "a device that is not there was made";
  } catch (const RuntimeFailure& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaSetDevice"), std::string::npos) << what;
    EXPECT_NE(what.find("device.cpp"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace mnist_mt
