// Loader throughput: one training epoch per iteration, batch 64 per rank, one consumer
// thread per rank taking batches as fast as the loader hands them over. Reports
// images/s; the trainer needs ~430,000 images/s per GPU at 150 us per 64-image step.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "mnist_mt/data_source.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/loader.hpp"

namespace mnist_mt {
namespace {

struct BenchData {
  Split split;
  std::string source;
};

// The real Fashion-MNIST training set when installed, else 60000 synthetic images.
const BenchData& bench_data() {
  static const BenchData data = [] {
    if (std::filesystem::exists(kDefaultDataDir))
      return BenchData{load_dataset(kDefaultDataDir).train, "fashion-mnist"};
    BenchData synthetic{{}, "synthetic"};
    const std::uint32_t n = 60000;
    synthetic.split.images.resize(std::size_t{n} * kImageBytes);
    synthetic.split.labels.resize(n);
    for (std::size_t i = 0; i < synthetic.split.images.size(); ++i)
      synthetic.split.images[i] = static_cast<std::uint8_t>(i * 2654435761u >> 24);
    for (std::uint32_t i = 0; i < n; ++i) synthetic.split.labels[i] = static_cast<std::uint8_t>(i % kClasses);
    return synthetic;
  }();
  return data;
}

void BM_LoaderEpoch(benchmark::State& state) {
  const BenchData& data = bench_data();
  const auto world = static_cast<std::uint32_t>(state.range(0));
  std::uint32_t epoch = 0;
  std::uint64_t images = 0;
  for (auto _ : state) {
    LoaderOptions options;
    options.world = world;
    options.batch = 64;
    options.seed = 1;
    options.epoch = epoch++;
    Loader loader(data.split, options);
    std::vector<std::uint64_t> per_rank(world, 0);
    std::vector<std::thread> consumers;
    for (std::uint32_t r = 0; r < world; ++r) {
      consumers.emplace_back([&loader, &per_rank, r] {
        std::uint64_t n = 0;
        while (const Batch* batch = loader.next(r)) {
          benchmark::DoNotOptimize(batch->images.data());
          n += batch->size;
        }
        per_rank[r] = n;
      });
    }
    for (auto& t : consumers) t.join();
    for (auto n : per_rank) images += n;
  }
  state.counters["images"] = benchmark::Counter(static_cast<double>(images), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(images * kImageBytes));
  state.SetLabel(data.source);
}

BENCHMARK(BM_LoaderEpoch)->ArgName("ranks")->Arg(1)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace mnist_mt

BENCHMARK_MAIN();
