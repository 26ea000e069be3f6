#include "mnist_mt/evaluate.hpp"

#include <cmath>
#include <limits>
#include <mutex>
#include <thread>

#include "train/evaluate_shard.hpp"
#include "mnist_mt/error.hpp"
#include "train/run.hpp"

namespace mnist_mt {
namespace {

TrainConfig train_config(const EvalConfig& config) {
  TrainConfig t;
  t.devices = config.devices;
  t.batch = config.batch;
  t.epochs = 0;
  t.load = config.checkpoint;
  return t;
}

struct Totals {
  std::mutex mutex;
  StepStats stats;
  ConfusionMatrix confusion{};
};

// One rank: its replica, the checkpoint's weights, its shard of the test set.
void evaluate_rank(Run& run, int rank, Totals& totals) noexcept {
  Device& device = run.device(rank);
  try {
    device.activate();
    const auto replica = run.backend().make_replica(device, run.config().batch);
    replica->write_params(run.start().params);
    ConfusionMatrix confusion{};
    const DropoutKey key{run.start().seed, run.start().epoch};
    const auto lease = run.loaders().acquire(run.start().epoch, false);
    const StepStats stats = evaluate_shard(*replica, lease.loader(), rank, key, &confusion);
    std::lock_guard lock(totals.mutex);
    totals.stats += stats;
    for (std::size_t i = 0; i < kClasses; ++i)
      for (std::size_t j = 0; j < kClasses; ++j) totals.confusion[i][j] += confusion[i][j];
  } catch (...) {
    run.fail(rank, run.start().step, std::current_exception());
  }
  drain(device);
}

}  // namespace

std::array<double, kClasses> EvalResult::class_accuracy() const {
  std::array<double, kClasses> out{};
  for (std::size_t label = 0; label < kClasses; ++label) {
    std::uint64_t total = 0;
    for (std::uint64_t n : confusion[label]) total += n;
    out[label] = total == 0 ? std::numeric_limits<double>::quiet_NaN()
                            : static_cast<double>(confusion[label][label]) / static_cast<double>(total);
  }
  return out;
}

EvalResult evaluate(Backend& backend, const Dataset& data, const EvalConfig& config) {
  const TrainConfig train = train_config(config);
  Run run(backend, data, train);
  Totals totals;
  {
    std::vector<std::jthread> workers;
    try {
      for (int r = 0; r < run.ranks(); ++r) workers.emplace_back([&run, &totals, r] { evaluate_rank(run, r, totals); });
    } catch (...) {  // a thread that could not start: release those that did
      run.fail(static_cast<int>(workers.size()), run.start().step, std::current_exception());
    }
  }
  run.rethrow_failure();
  EvalResult result;
  result.samples = static_cast<std::uint64_t>(totals.stats.samples);
  result.loss = totals.stats.loss_sum / totals.stats.samples;
  result.accuracy = totals.stats.correct / totals.stats.samples;
  result.confusion = totals.confusion;
  return result;
}

}  // namespace mnist_mt
