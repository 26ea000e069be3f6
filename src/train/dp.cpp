// The DataParallel-style baseline (DESIGN.md decision 7): one host thread drives every
// device. Each step: broadcast the parameters from device 0, scatter the global batch,
// forward everywhere with the loss over the global batch, backward everywhere, reduce
// the gradients to device 0 and update there. Nothing overlaps; it is the yardstick.
#include <functional>
#include <optional>
#include <string>

#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "run.hpp"

namespace mnist_mt {
namespace {

class DpLoop {
 public:
  explicit DpLoop(Run& run) : run_(run), step_(run.start.step) {}

  void operator()() noexcept {
    try {
      for (int d = 0; d < run_.world(); ++d) {
        replicas_.push_back(run_.backend.make_replica(on(d), run_.config.batch));
        replicas_.back()->prepare(run_.batch_sizes(d));
      }
      on(0);
      replicas_[0]->write_params(run_.start.params);
      if (!run_.start.momentum.empty()) replicas_[0]->write_momentum(run_.start.momentum);
      for (std::uint32_t epoch = run_.start.epoch; epoch < run_.last_epoch(); ++epoch) {
        if (!train_epoch(epoch)) break;
      }
      run_.beat(0, step_, Phase::kDone);
      on(0);
      run_.result.params.resize(kParamCount);
      replicas_[0]->read_params(run_.result.params);
    } catch (...) {
      run_.fail(rank_, step_, std::current_exception());
    }
    for (auto& d : run_.devices) drain(*d);
  }

 private:
  // Makes device d current for this thread; errors are blamed on its rank.
  Device& on(int d) {
    rank_ = d;
    run_.devices[d]->activate();
    return *run_.devices[d];
  }

  // Runs `op(d)` for every rank inside one group of collectives. The group is closed
  // even when a call inside it throws: an open NCCL group would hold every later call of
  // this thread, the aborts of the failure path included.
  void collective(const std::function<void(int)>& op) {
    run_.backend.group_start();
    try {
      for (int d = 0; d < run_.world(); ++d) {
        on(d).comm_wait_compute();
        op(d);
      }
    } catch (...) {
      try {
        run_.backend.group_end();
      } catch (...) {  // the first error is the one to report
      }
      throw;
    }
    run_.backend.group_end();
  }

  // Device 0's parameters to every device; the host waits until all have them.
  void broadcast_params() {
    collective([&](int d) { run_.comms[d]->broadcast(replicas_[d]->params(), kParamCount, 0); });
    for (int d = 0; d < run_.world(); ++d) on(d).synchronize();
  }

  void wait_compute_all() {
    for (int d = 0; d < run_.world(); ++d) on(d).wait_compute();
  }

  // False when a stop request ended the run inside this epoch. The watchdog sees the
  // one host thread as rank 0.
  bool train_epoch(std::uint32_t epoch) {
    const DropoutKey key{run_.start.seed, epoch};
    EpochMetrics m;
    m.epoch = epoch + 1;
    StepStats train;
    {
      Loader loader(run_.data.train, run_.loaders.options(epoch, true));
      const std::uint32_t first = run_.first_step(epoch);
      for (std::uint32_t k = 0; k < first; ++k)
        for (int d = 0; d < run_.world(); ++d)
          if (loader.next(d) == nullptr) throw RuntimeFailure("the loader ended early");
      // The host waits for the device in every step: its stats are current, nothing to read.
      const bool done = run_.train_steps(
          0, m, first, run_.steps_in_epoch(loader.steps()), replicas_[0].get(), step_, train,
          [&](PhaseSeconds& phase) {
            const std::optional<StepStats> stats = step(loader, key, phase);
            ++step_;
            if (!stats) ++m.skipped_steps;
            train += stats.value_or(StepStats{});
          },
          [](bool) {});
      if (!done) {
        on(0);
        run_.end_interrupted(*replicas_[0], epoch, first + static_cast<std::uint32_t>(m.steps), step_);
        return false;
      }
    }
    run_.beat(0, step_, Phase::kEvaluate);
    set_results(m, train, run_.config.evaluate ? evaluate(key) : StepStats{});
    run_.end_epoch(m, *replicas_[0], step_);
    return true;
  }

  // Empty when the step's update was dropped (NanPolicy::kSkip).
  std::optional<StepStats> step(Loader& loader, const DropoutKey& key, PhaseSeconds& phase) {
    const int world = run_.world();
    Stopwatch clock;
    std::vector<const Batch*> batches(world);
    std::uint32_t global = 0;
    run_.beat(0, step_, Phase::kData);
    for (int d = 0; d < world; ++d) {
      on(d);
      run_.inject_fault(d, step_);
      batches[d] = loader.next(d);
      if (batches[d] == nullptr) throw RuntimeFailure("the loader ended early");
      global += batches[d]->size;
    }
    phase.data_wait += clock.lap();

    broadcast_params();
    phase.comm_wait += clock.lap();

    run_.beat(0, step_, Phase::kForward);
    StepStats stats;
    for (int d = 0; d < world; ++d) {
      on(d);
      run_.inject_nan(d, step_, *replicas_[d]);
      replicas_[d]->set_input(*batches[d]);
      replicas_[d]->forward(true, key, global);
    }
    for (int d = 0; d < world; ++d) {
      on(d);
      const StepStats device_stats = replicas_[d]->take_stats();
      run_.check_loss(device_stats.loss_sum);  // naming the device
      stats += device_stats;
    }
    phase.forward += clock.lap();
    run_.beat(0, step_, Phase::kBackward);

    for (int d = 0; d < world; ++d) {
      on(d);
      replicas_[d]->backward([](int) {});
    }
    wait_compute_all();
    phase.backward += clock.lap();

    run_.beat(0, step_, Phase::kCommWait);
    collective([&](int d) { run_.comms[d]->reduce(replicas_[d]->grads(), kParamCount, ReduceOp::kSum, 0); });
    on(0).synchronize();
    phase.comm_wait += clock.lap();

    on(0).compute_wait_comm();
    const bool apply = run_.apply_update(0, stats.loss_sum, reduced_grad_norm(*run_.comms[0], *replicas_[0]));
    if (apply) replicas_[0]->sgd_step(run_.config.sgd);
    for (int d = 0; d < world; ++d) run_.undo_nan(d, step_, *replicas_[d]);
    on(0).wait_compute();
    phase.optimizer += clock.lap();
    if (!apply) return std::nullopt;
    return stats;
  }

  // Every device its shard of the test set, with device 0's parameters.
  StepStats evaluate(const DropoutKey& key) {
    broadcast_params();
    Loader loader(run_.data.test, run_.loaders.options(key.epoch, false));
    for (std::uint32_t k = 0; k < loader.steps(); ++k) {
      for (int d = 0; d < run_.world(); ++d) {
        const Batch* batch = loader.next(d);
        if (batch == nullptr) throw RuntimeFailure("the loader ended early");
        if (batch->size == 0) continue;
        on(d);
        replicas_[d]->set_input(*batch);
        replicas_[d]->forward(false, key, batch->size);
      }
    }
    StepStats stats;
    for (int d = 0; d < run_.world(); ++d) {
      on(d);
      stats += replicas_[d]->take_stats();
    }
    return stats;
  }

  Run& run_;
  std::uint64_t step_;
  int rank_ = 0;  // the device being driven
  std::vector<std::unique_ptr<Replica>> replicas_;
};

}  // namespace

void train_dp(Run& run) {
  DpLoop loop(run);
  loop();
}

}  // namespace mnist_mt
