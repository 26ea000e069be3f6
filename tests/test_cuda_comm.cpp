// NCCL communicators over every visible GPU, each rank on its own thread as the trainer
// runs them: allreduce, broadcast, reduce, barrier and allreduce_host against results
// computed on the host, and abort() releasing ranks that wait for a peer. Skips where
// there is no GPU; the error test runs everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/error.hpp"

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

#define SKIP_WITHOUT_GPU() \
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA device"

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
    check(cudaMemcpy(data_, values.data(), count_ * sizeof(float), cudaMemcpyHostToDevice));
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

struct Group {
  Group() : backend(make_cuda_backend({})) {
    std::vector<int> ids(static_cast<std::size_t>(backend->device_count()));
    std::iota(ids.begin(), ids.end(), 0);
    devices = backend->make_devices(ids);
    std::vector<Device*> raw;
    for (auto& d : devices) raw.push_back(d.get());
    comms = backend->make_communicators(raw);
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

// Small integers: every sum is exact in fp32, whatever order NCCL adds in.
constexpr std::size_t kCount = 1000003;  // not a multiple of any chunk size
std::vector<float> rank_values(int rank, std::size_t count) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
  return v;
}
float sum_over_ranks(int world, std::size_t i) { return static_cast<float>(world * (world + 1) / 2 * (i % 7 + 1)); }

TEST(CudaComm, AllreduceSumsOverEveryGpu) {
  SKIP_WITHOUT_GPU();
  Group g;
  g.on_every_rank([&](int r) {
    DeviceFloats buf(rank_values(r, kCount));
    g.comms[r]->allreduce(buf.data(), kCount, ReduceOp::kSum);
    g.devices[r]->synchronize();
    const std::vector<float> got = buf.read();
    for (std::size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(got[i], sum_over_ranks(g.world(), i)) << "rank " << r << " at " << i;
  });
}

TEST(CudaComm, AllreduceAverages) {
  SKIP_WITHOUT_GPU();
  Group g;
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

TEST(CudaComm, BroadcastCopiesTheRootsBuffer) {
  SKIP_WITHOUT_GPU();
  Group g;
  const int root = g.world() - 1;
  g.on_every_rank([&](int r) {
    DeviceFloats buf(rank_values(r, kCount));
    g.comms[r]->broadcast(buf.data(), kCount, root);
    g.devices[r]->synchronize();
    EXPECT_EQ(buf.read(), rank_values(root, kCount)) << "rank " << r;
  });
}

TEST(CudaComm, ReduceLandsOnTheRootOnly) {
  SKIP_WITHOUT_GPU();
  Group g;
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

TEST(CudaComm, AllreduceHostSumsDoubles) {
  SKIP_WITHOUT_GPU();
  Group g;
  g.on_every_rank([&](int r) {
    std::vector<double> values(300);  // more than one pass through the device scratch
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5 * (r + 1) + static_cast<double>(i);
    g.comms[r]->allreduce_host(values);
    const int w = g.world();
    for (std::size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(values[i], 0.25 * w * (w + 1) + static_cast<double>(w) * static_cast<double>(i)) << "at " << i;
  });
}

TEST(CudaComm, BarrierCompletesOnEveryRank) {
  SKIP_WITHOUT_GPU();
  Group g;
  g.on_every_rank([&](int r) {
    EXPECT_EQ(g.comms[r]->rank(), r);
    EXPECT_EQ(g.comms[r]->size(), g.world());
    g.comms[r]->barrier();
    g.devices[r]->synchronize();
  });
}

// A rank that never joins (as if it failed) must not leave its peers waiting: abort()
// releases them with Aborted, may be called again, and refuses later collectives.
TEST(CudaComm, AbortReleasesRanksWaitingForAPeer) {
  SKIP_WITHOUT_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs";
  Group g;
  std::vector<std::exception_ptr> errors(g.devices.size());
  std::vector<std::thread> waiting;
  for (int r = 1; r < g.world(); ++r) {
    waiting.emplace_back([&, r] {
      try {
        g.devices[r]->activate();
        DeviceFloats buf(rank_values(r, kCount));
        g.comms[r]->allreduce(buf.data(), kCount, ReduceOp::kSum);
        g.devices[r]->synchronize();
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  std::this_thread::sleep_for(500ms);
  g.comms[0]->abort();
  g.comms[0]->abort();
  auto joined = std::async(std::launch::async, [&] {
    for (auto& t : waiting) t.join();
  });
  ASSERT_EQ(joined.wait_for(20s), std::future_status::ready) << "a rank is still waiting after abort()";
  for (int r = 1; r < g.world(); ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " finished its allreduce without rank 0";
    EXPECT_THROW(std::rethrow_exception(errors[r]), Aborted) << "rank " << r;
  }
  g.devices[1]->activate();
  DeviceFloats buf(rank_values(1, 16));
  EXPECT_THROW(g.comms[1]->allreduce(buf.data(), 16, ReduceOp::kSum), Aborted);
}

// Runs with or without a GPU: a failed call names itself and where it was made.
TEST(CudaComm, FailedCallReportsTheCallAndThePlace) {
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
