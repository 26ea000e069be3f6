// Training step time through the real trainer (forward + backward + allreduce + SGD),
// DDP against the DataParallel-style baseline, 1..N devices, batch 4 (the template's),
// 64 and 256 per device. Each case trains two short epochs on synthetic in-memory
// data and reports the second, so one-time setup (threads, primitives, first touch of
// memory) stays out of the figures. Reported time is per step.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/trainer.hpp"

namespace mnist_mt {
namespace {

constexpr std::uint32_t kBatches[] = {4, 64, 256};

// Images each device trains on per measured epoch: a few seconds per case on one core.
std::uint32_t images_per_device(const Backend& backend) { return backend.name() == "cpu" ? 2048 : 16384; }

Split synthetic_split(std::uint32_t size, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255), label(0, 9);
  Split s;
  s.images.resize(std::size_t{size} * kImageBytes);
  s.labels.resize(size);
  for (auto& p : s.images) p = static_cast<std::uint8_t>(byte(gen));
  for (auto& l : s.labels) l = static_cast<std::uint8_t>(label(gen));
  return s;
}

void bench_step(benchmark::State& state, Backend& backend, Mode mode, int world, std::uint32_t batch) {
  const std::uint32_t steps = std::max<std::uint32_t>(3, images_per_device(backend) / batch);
  Dataset data{synthetic_split(steps * batch * world, 1), synthetic_split(batch * world, 2)};
  TrainConfig config;
  config.mode = mode;
  config.devices.resize(world);
  std::iota(config.devices.begin(), config.devices.end(), 0);
  config.epochs = 2;
  config.batch = batch;
  config.sgd = {0.01f, 0.9f, 0.0f};
  config.max_steps = steps;
  config.evaluate = false;

  TrainResult result;
  for (auto _ : state) {
    try {
      result = train(backend, data, config);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
    const EpochMetrics& m = result.epochs.back();
    state.SetIterationTime(m.seconds / static_cast<double>(m.steps ? m.steps : steps));
  }
  const EpochMetrics& m = result.epochs.back();
  const double n = static_cast<double>(m.steps ? m.steps : steps);
  const double us = 1e6 / n;
  const PhaseSeconds& p = m.phase_seconds;
  state.counters["images/s"] = m.images_per_s;
  state.counters["us/step"] = m.seconds * us;
  // Exposed communication: time the step waited for allreduce beyond the backward.
  state.counters["comm_us"] = p.comm_wait * us;
  state.counters["comm_%"] = m.seconds > 0 ? 100.0 * p.comm_wait / m.seconds : 0.0;
  state.counters["data_us"] = p.data_wait * us;
  state.counters["fwd_us"] = p.forward * us;
  state.counters["bwd_us"] = p.backward * us;
  state.counters["opt_us"] = p.optimizer * us;
}

void register_steps(Backend& backend, int max_world) {
  for (std::uint32_t batch : kBatches) {
    for (int world = 1; world <= max_world; ++world) {
      for (Mode mode : {Mode::kDdp, Mode::kDp}) {
        const std::string name = "step/" + backend.name() + "/" + (mode == Mode::kDdp ? "ddp" : "dp") +
                                 "/devices:" + std::to_string(world) + "/batch:" + std::to_string(batch);
        benchmark::RegisterBenchmark(name.c_str(), [&backend, mode, world, batch](benchmark::State& st) {
          bench_step(st, backend, mode, world, batch);
        })->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace
}  // namespace mnist_mt

int main(int argc, char** argv) {
  using namespace mnist_mt;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  std::unique_ptr<Backend> cpu = make_cpu_backend({});
  register_steps(*cpu, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::unique_ptr<Backend> cuda;
  if (cuda_built()) {
    try {
      cuda = make_cuda_backend({});
      if (cuda->device_count() > 0) register_steps(*cuda, cuda->device_count());
    } catch (const std::exception& e) {
      benchmark::AddCustomContext("cuda", std::string("not measured: ") + e.what());
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
