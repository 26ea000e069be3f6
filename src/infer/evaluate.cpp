#include "mnist_mt/evaluate.hpp"

#include <cmath>
#include <limits>
#include <mutex>

#include "mnist_mt/error.hpp"
#include "mnist_mt/evaluate_shard.hpp"
#include "mnist_mt/test_pass.hpp"

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
  Totals totals;
  for_each_test_shard(backend, data, train_config(config),
                      [&totals](int rank, Replica& replica, Loader& loader, const DropoutKey& key) {
                        ConfusionMatrix confusion{};
                        const StepStats stats = evaluate_shard(replica, loader, rank, key, &confusion);
                        std::lock_guard lock(totals.mutex);
                        totals.stats += stats;
                        for (std::size_t i = 0; i < kClasses; ++i)
                          for (std::size_t j = 0; j < kClasses; ++j) totals.confusion[i][j] += confusion[i][j];
                      });
  EvalResult result;
  result.samples = static_cast<std::uint64_t>(totals.stats.samples);
  result.loss = totals.stats.loss_sum / totals.stats.samples;
  result.accuracy = totals.stats.correct / totals.stats.samples;
  result.confusion = totals.confusion;
  return result;
}

}  // namespace mnist_mt
