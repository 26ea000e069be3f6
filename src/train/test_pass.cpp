#include "mnist_mt/test_pass.hpp"

#include <exception>
#include <thread>
#include <vector>

#include "run.hpp"

namespace mnist_mt {
namespace {

void run_rank(Run& run, int rank, const TestShardPass& pass) noexcept {
  Device& device = run.device(rank);
  try {
    device.activate();
    const auto replica = run.backend().make_replica(device, run.config().batch);
    replica->hold_data(run.samples().last(1));  // the test split: all an evaluation reads
    replica->write_params(run.start().params);
    const auto lease = run.loaders().acquire(run.start().epoch, false);
    pass(rank, *replica, lease.loader(), DropoutKey{run.start().seed, run.start().epoch});
  } catch (...) {
    run.fail(rank, run.start().step, std::current_exception());
  }
  drain(device);
}

}  // namespace

void for_each_test_shard(Backend& backend, const Dataset& data, const TrainConfig& config, const TestShardPass& pass) {
  Run run(backend, data, config);
  {
    std::vector<std::jthread> workers;
    try {
      for (int r = 0; r < run.ranks(); ++r) workers.emplace_back([&run, &pass, r] { run_rank(run, r, pass); });
    } catch (...) {  // a thread that could not start: release those that did
      run.fail(static_cast<int>(workers.size()), run.start().step, std::current_exception());
    }
  }
  run.rethrow_failure();
}

}  // namespace mnist_mt
