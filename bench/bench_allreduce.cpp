// Allreduce bandwidth of each backend's communicator with nccl-tests' counters
// (algbw = bytes/time, busbw = algbw * 2(W-1)/W), and a single-thread memcpy of the
// same sizes: the bound the in-process CPU communicator is held to. Under mpirun it
// measures the CPU allreduce between the launch's processes instead, one rank each
// (allreduce/cpu/processes:P/...), with a fixed number of iterations that every process
// runs; world rank 0's process reports.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/processes.hpp"

#ifdef MNIST_MT_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mnist_mt {
namespace {

constexpr std::size_t kGradientBytes = kParamCount * sizeof(float);
constexpr int kMaxCpuRanks = 4;

struct Size {
  std::string label;
  std::size_t bytes;
};

// 4 KiB to 64 MiB in powers of 4, then the model's gradient.
std::vector<Size> sizes() {
  std::vector<Size> out;
  for (std::size_t kib = 4; kib <= 64 * 1024; kib *= 4) {
    out.push_back({kib < 1024 ? std::to_string(kib) + "KiB" : std::to_string(kib / 1024) + "MiB", kib * 1024});
  }
  out.push_back({"gradient", kGradientBytes});
  return out;
}

// `count` floats in the memory of the device the calling thread has activated.
class Buffer {
 public:
  Buffer(bool cuda, std::size_t count) : cuda_(cuda) {
    if (!cuda_) {
      host_.assign(count, 1.0f);  // touched here, on the rank's own thread
      data_ = host_.data();
      return;
    }
#ifdef MNIST_MT_BENCH_CUDA
    void* p = nullptr;
    if (cudaMalloc(&p, count * sizeof(float)) != cudaSuccess || cudaMemset(p, 0, count * sizeof(float)) != cudaSuccess) {
      cudaFree(p);
      throw RuntimeFailure("bench_allreduce: cudaMalloc of " + std::to_string(count * sizeof(float)) + " bytes failed");
    }
    data_ = static_cast<float*>(p);
#else
    throw RuntimeFailure("bench_allreduce: built without CUDA");
#endif
  }
  ~Buffer() {
#ifdef MNIST_MT_BENCH_CUDA
    if (cuda_) cudaFree(data_);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() { return data_; }

 private:
  bool cuda_;
  std::vector<float> host_;
  float* data_ = nullptr;
};

// Rank 0 runs the timed loop on the benchmark's thread; ranks 1..W-1 run the same
// number of allreduces on threads of their own, kept in step by the collective itself.
// Each rank enqueues the allreduce on its comm stream and waits for its device.
// `world`: this process's ranks; with `place`'s processes, each runs as many.
void bench_allreduce(benchmark::State& state, Backend& backend, int world, std::size_t bytes, const Place& place = {}) {
  std::vector<int> ids(world);
  std::iota(ids.begin(), ids.end(), 0);
  auto devices = backend.make_devices(ids);
  std::vector<Device*> raw;
  for (auto& d : devices) raw.push_back(d.get());
  auto comms = backend.make_communicators(raw, place);
  const bool cuda = backend.name() == "cuda";
  const std::size_t count = bytes / sizeof(float);

  std::mutex error_mutex;
  std::exception_ptr error;
  auto fail = [&](std::exception_ptr e) {
    std::lock_guard lock(error_mutex);
    if (!error) error = e;
    for (auto& c : comms) c->abort();
  };
  auto step = [&](int rank, Buffer& buffer) {
    comms[rank]->allreduce(buffer.data(), count, ReduceOp::kAverage);
    devices[rank]->synchronize();
  };

  // One untimed allreduce first on every rank: whatever a first call sets up.
  const auto rounds = state.max_iterations + 1;
  std::vector<std::thread> peers;
  for (int rank = 1; rank < world; ++rank) {
    peers.emplace_back([&, rank] {
      try {
        devices[rank]->activate();
        Buffer buffer(cuda, count);
        for (benchmark::IterationCount i = 0; i < rounds; ++i) step(rank, buffer);
      } catch (...) {
        fail(std::current_exception());
      }
    });
  }
  try {
    devices[0]->activate();
    Buffer buffer(cuda, count);
    step(0, buffer);
    for (auto _ : state) step(0, buffer);
  } catch (...) {
    fail(std::current_exception());
  }
  for (auto& t : peers) t.join();
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      if (place.processes) {  // the other processes wait in the next exchange: end them
        std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
        place.processes->abort(3);
      }
      state.SkipWithError(e.what());
    }
    return;
  }
  const double b = static_cast<double>(count * sizeof(float));
  const double all = comms[0]->size();  // the world's ranks
  state.counters["algbw"] = benchmark::Counter(b, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw"] = benchmark::Counter(b * 2.0 * (all - 1) / all, benchmark::Counter::kIsIterationInvariantRate);
}

// The processes of an MPI launch, one CPU rank each. Google Benchmark picks iteration
// counts on its own per process; every process must run the same allreduces, so here
// they are fixed: about 256 MiB moved per size, at least 20 rounds.
void register_processes(Backend& backend, const Place& place) {
  for (const Size& s : sizes()) {
    const auto rounds = static_cast<benchmark::IterationCount>(std::max<std::size_t>(20, (256u << 20) / s.bytes));
    const std::string name =
        "allreduce/cpu/processes:" + std::to_string(place.process_count()) + "/ranks:1/" + s.label;
    benchmark::RegisterBenchmark(name.c_str(), [&backend, &place, bytes = s.bytes](benchmark::State& st) {
      bench_allreduce(st, backend, 1, bytes, place);
    })->UseRealTime()->Iterations(std::min<benchmark::IterationCount>(rounds, 20000));
  }
}

// The other processes' results go nowhere.
class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

void bench_memcpy(benchmark::State& state, std::size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.counters["bw"] = benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

void register_allreduce(Backend& backend, int max_world) {
  for (int world = 2; world <= max_world; ++world) {
    for (const Size& s : sizes()) {
      const std::string name = "allreduce/" + backend.name() + "/ranks:" + std::to_string(world) + "/" + s.label;
      benchmark::RegisterBenchmark(name.c_str(), [&backend, world, bytes = s.bytes](benchmark::State& st) {
        bench_allreduce(st, backend, world, bytes);
      })->UseRealTime();
    }
  }
}

}  // namespace
}  // namespace mnist_mt

int main(int argc, char** argv) {
  using namespace mnist_mt;
  std::shared_ptr<Processes> processes;
  try {
    processes = join_launch(argc, argv, 60);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (processes) {
    Place place;
    place.processes = processes;
    place.first_rank = processes->index();
    place.world = processes->count();
    std::unique_ptr<Backend> cpu = make_cpu_backend({});
    register_processes(*cpu, place);
    Silent silent;
    if (processes->index() == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      benchmark::RunSpecifiedBenchmarks(&silent);
    }
    benchmark::Shutdown();
    return 0;
  }

  for (const Size& s : sizes()) {
    benchmark::RegisterBenchmark(("memcpy/1thread/" + s.label).c_str(),
                                 [bytes = s.bytes](benchmark::State& st) { bench_memcpy(st, bytes); });
  }
  BackendOptions pinned;  // as mnist_mt runs them: a CPU each when the ranks are as many as the CPUs
  pinned.pin_cpu_threads = true;
  std::unique_ptr<Backend> cpu = make_cpu_backend(pinned);
  register_allreduce(*cpu, kMaxCpuRanks);

  std::unique_ptr<Backend> cuda;
  if (cuda_built()) {
    try {
      cuda = make_cuda_backend({});
      if (cuda->device_count() >= 2) {
        register_allreduce(*cuda, cuda->device_count());
      } else {
        benchmark::AddCustomContext("cuda", "not measured: fewer than 2 GPUs");
      }
    } catch (const std::exception& e) {
      benchmark::AddCustomContext("cuda", std::string("not measured: ") + e.what());
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
