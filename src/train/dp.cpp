// The DataParallel baseline (docs/architecture.md decision 12), as torch.nn.DataParallel does it from
// one host thread. Each step: the global batch to device 0; the parameters broadcast from
// device 0 and the batch scattered from it; forward on every device; the outputs gathered
// to device 0 and the loss of the global batch computed there; the output gradients
// scattered; backward on every device; the gradients reduced to device 0 (after the
// whole backward, no overlap) and the update there, the only optimizer state. The other
// devices' replicas are refreshed every step. Nothing overlaps; it is the yardstick.
// Device d's chunk holds the samples the loader's shard d has, so dropout, keyed per
// sample, masks what DDP's rank d masks.
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mnist_mt/local_group.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "run.hpp"
#include "target.hpp"

namespace mnist_mt {
namespace {

class DpLoop {
 public:
  explicit DpLoop(Run& run) : run_(run), step_(run.start().step), target_(run.config()) {}

  void operator()() noexcept {
    try {
      const std::uint32_t global = run_.config().batch * static_cast<std::uint32_t>(run_.ranks());
      for (int d = 0; d < run_.ranks(); ++d) {
        // Device 0 holds the global batch, its outputs and their gradients.
        replicas_.push_back(run_.backend().make_replica(on(d), d == 0 ? global : run_.config().batch));
        replicas_.back()->prepare(run_.batch_sizes(d));
      }
      on(0);
      replicas_[0]->hold_data(run_.samples());  // only device 0 reads the batch
      batch_.images.resize(std::size_t{global} * kImageBytes);
      batch_.labels.resize(global);
      batch_.indices.resize(global);
      on(0);
      replicas_[0]->write_params(run_.start().params);
      if (!run_.start().state.first.empty()) replicas_[0]->write_state(run_.start().state);
      for (std::uint32_t epoch = run_.start().epoch; epoch < run_.last_epoch(); ++epoch) {
        if (!train_epoch(epoch)) break;
      }
      run_.beat(0, step_, Phase::kDone);
      on(0);
      run_.keep_params(*replicas_[0]);
    } catch (...) {
      run_.fail(rank_, step_, std::current_exception());
    }
    for (int d = 0; d < run_.ranks(); ++d) drain(run_.device(d));
  }

 private:
  // Makes device d current for this thread; errors are blamed on its rank.
  Device& on(int d) {
    rank_ = d;
    run_.device(d).activate();
    return run_.device(d);
  }

  // Runs `op(d)` for every rank inside one group of collectives (the backend's, NCCL's,
  // and the local group's of ranks that share a device). Both groups are closed even when
  // a call inside throws: an open NCCL group would hold every later call of this thread,
  // the aborts of the failure path included. The first error is the one reported.
  void collective(const std::function<void(int)>& op) {
    run_.backend().group_start();
    local_group_start();
    std::exception_ptr first;
    try {
      for (int d = 0; d < run_.ranks(); ++d) {
        on(d).comm_wait_compute();
        op(d);
      }
    } catch (...) {
      first = std::current_exception();
      // Ranks not reached never join: released, so that closing the group cannot wait for them.
      run_.abort_collectives();
    }
    const std::function<void()> ends[] = {local_group_end, [this] { run_.backend().group_end(); }};
    for (const auto& end : ends) {
      try {
        end();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  // Device 0's parameters to every device; the host waits until all have them.
  void broadcast_params() {
    collective([&](int d) { run_.comm(d).broadcast(replicas_[d]->params(), kParamCount, 0); });
    synchronize_all();
  }

  void synchronize_all() {
    for (int d = 0; d < run_.ranks(); ++d) on(d).synchronize();
  }

  // Rows of `width` floats, chunk d of device 0's `buffer(0)` to device d's `buffer(d)`
  // (scatter) or back (gather), then every device's compute stream waits for it.
  void move_rows(bool scatter, std::size_t width, float* (Replica::*buffer)()) {
    std::vector<std::size_t> counts;
    for (const std::uint32_t rows : chunks_) counts.push_back(rows * width);
    collective([&](int d) {
      float* data = (replicas_[d].get()->*buffer)();
      if (scatter)
        run_.comm(d).scatter(data, counts, 0);
      else
        run_.comm(d).gather(data, counts, 0);
    });
    for (int d = 0; d < run_.ranks(); ++d) on(d).compute_wait_comm();
  }

  // False when a stop request ended the run inside this epoch, or it reached the target
  // accuracy. The watchdog sees the one host thread as rank 0.
  bool train_epoch(std::uint32_t epoch) {
    const DropoutKey key{run_.start().seed, epoch};
    EpochMetrics m;
    m.epoch = epoch + 1;
    StepStats train;
    std::uint32_t epoch_step = 0;  // where the target was reached in the epoch; 0: at its end
    {
      Loader loader(run_.data().train, run_.loaders().options(epoch, true));
      const std::uint32_t first = run_.first_step(epoch);
      for (std::uint32_t k = 0; k < first; ++k)
        for (int d = 0; d < run_.ranks(); ++d)
          if (loader.next(d) == nullptr) throw RuntimeFailure("the loader ended early");
      // The host waits for the device in every step: its stats are current, nothing to read.
      const bool done = run_.train_steps(
          0, m, first, run_.steps_in_epoch(loader.steps()), replicas_[0].get(), step_, train,
          [&](PhaseSeconds& phase) {
            target_.step_started();
            const std::optional<StepStats> stats = step(loader, key, phase);
            ++step_;
            if (!stats) ++m.skipped_steps;
            train += stats.value_or(StepStats{});
          },
          [](bool) {},
          [&] {
            const double began = steady_seconds();
            run_.beat(0, step_, Phase::kEvaluate);
            const StepStats test = evaluate(key);
            run_.report_evaluation(step_, test.correct / test.samples);
            return target_.evaluated(m, test, began, step_);
          });
      if (!done) {
        on(0);
        run_.end_interrupted(*replicas_[0], epoch, first + static_cast<std::uint32_t>(m.steps), step_);
        return false;
      }
      if (target_.reached()) epoch_step = first + static_cast<std::uint32_t>(m.steps);
    }
    // The epoch's end: its test stats, unless the target was reached inside it.
    StepStats test;
    if (target_.reached()) {
      test = target_.reached_test();
    } else if (run_.config().evaluate) {
      const double began = steady_seconds();
      run_.beat(0, step_, Phase::kEvaluate);
      test = evaluate(key);
      target_.evaluated(m, test, began, step_);
    }
    set_results(m, train, test);
    run_.end_epoch(m, *replicas_[0], step_, epoch_step);
    return !target_.reached();
  }

  // Empty when the step's update was dropped (NanPolicy::kSkip).
  std::optional<StepStats> step(Loader& loader, const DropoutKey& key, PhaseSeconds& phase) {
    const int world = run_.ranks();
    Stopwatch clock;
    run_.beat(0, step_, Phase::kData);
    gather_batch(loader);
    phase.data_wait += clock.lap();

    run_.beat(0, step_, Phase::kCollective);
    collective([&](int d) { run_.comm(d).broadcast(replicas_[d]->params(), kParamCount, 0); });
    on(0);
    replicas_[0]->set_input(batch_);
    move_rows(true, kImageBytes, &Replica::input);
    std::uint32_t first = 0;
    for (int d = 0; d < world; ++d) {
      on(d);
      const std::span<const std::uint32_t> samples(batch_.indices.data() + first, chunks_[d]);
      if (d == 0)
        replicas_[0]->use_rows(chunks_[0]);
      else
        replicas_[d]->set_scattered_input(samples);
      first += chunks_[d];
    }
    synchronize_all();
    phase.broadcast += clock.lap();

    run_.beat(0, step_, Phase::kForward);
    for (int d = 0; d < world; ++d) {
      on(d);
      run_.faults().nan(d, step_, *replicas_[d]);
      replicas_[d]->forward_logits(true, key);
    }
    for (int d = 0; d < world; ++d) on(d).wait_compute();
    phase.forward += clock.lap();

    run_.beat(0, step_, Phase::kCollective);
    move_rows(false, kClasses, &Replica::logits);
    on(0);
    replicas_[0]->loss(0, batch_.size, batch_.size);
    const StepStats stats = replicas_[0]->take_stats();
    if (!std::isfinite(stats.loss_sum)) blame_non_finite_loss();
    move_rows(true, kClasses, &Replica::logit_grads);
    synchronize_all();
    phase.gather += clock.lap();

    run_.beat(0, step_, Phase::kBackward);
    for (int d = 0; d < world; ++d) {
      on(d);
      replicas_[d]->backward([](int) {});
    }
    for (int d = 0; d < world; ++d) on(d).wait_compute();
    phase.backward += clock.lap();

    run_.beat(0, step_, Phase::kCommWait);
    collective([&](int d) { run_.comm(d).reduce(replicas_[d]->grads(), kParamCount, ReduceOp::kSum, 0); });
    on(0).synchronize();
    phase.comm_wait += clock.lap();

    run_.beat(0, step_, Phase::kOptimizer);
    on(0).compute_wait_comm();
    const bool apply = run_.apply_update(0, stats.loss_sum, reduced_grad_norm(run_.comm(0), *replicas_[0]));
    if (apply) replicas_[0]->update(run_.update_options(step_));
    for (int d = 0; d < world; ++d) run_.faults().undo_nan(d, step_, *replicas_[d]);
    on(0).wait_compute();
    phase.optimizer += clock.lap();
    if (!apply) return std::nullopt;
    return stats;
  }

  // The step's global batch on the host, shard d as chunk d.
  void gather_batch(Loader& loader) {
    const int world = run_.ranks();
    chunks_.assign(static_cast<std::size_t>(world), 0);
    std::uint32_t n = 0;
    for (int d = 0; d < world; ++d) {
      on(d);
      run_.faults().fault(d, step_);
      const Batch* b = loader.next(d);
      if (b == nullptr) throw RuntimeFailure("the loader ended early");
      if (b->size == 0) throw RuntimeFailure("an empty training shard");  // drop_last makes every shard full
      std::memcpy(batch_.images.data() + std::size_t{n} * kImageBytes, b->images.data(),
                  std::size_t{b->size} * kImageBytes);
      std::memcpy(batch_.labels.data() + n, b->labels.data(), b->size);
      std::memcpy(batch_.indices.data() + n, b->indices.data(), b->size * sizeof(std::uint32_t));
      chunks_[static_cast<std::size_t>(d)] = b->size;
      batch_.epoch = b->epoch;
      batch_.step = b->step;
      batch_.split_images = b->split_images;
      n += b->size;
    }
    batch_.size = n;
  }

  // The global loss is not finite: under --on-nan stop, the first device whose own rows'
  // loss is not finite fails the run (device 0 computes every row's loss; each row came
  // from one device). Under skip, the non-finite gradients drop the update.
  void blame_non_finite_loss() {
    if (run_.config().on_nan != NanPolicy::kStop) return;
    std::uint32_t first = 0;
    for (int d = 0; d < run_.ranks(); ++d) {
      on(0);
      replicas_[0]->loss(first, chunks_[d], batch_.size);
      const double loss_sum = replicas_[0]->take_stats().loss_sum;
      first += chunks_[d];
      on(d);
      run_.check_loss(loss_sum);
    }
    on(0);
    run_.check_loss(std::numeric_limits<double>::quiet_NaN());
  }

  // Every device its shard of the test set, with device 0's parameters.
  StepStats evaluate(const DropoutKey& key) {
    broadcast_params();
    Loader loader(run_.data().test, run_.loaders().options(key.epoch, false));
    for (std::uint32_t k = 0; k < loader.steps(); ++k) {
      for (int d = 0; d < run_.ranks(); ++d) {
        const Batch* batch = loader.next(d);
        if (batch == nullptr) throw RuntimeFailure("the loader ended early");
        if (batch->size == 0) continue;
        on(d);
        replicas_[d]->set_input(*batch);
        replicas_[d]->forward(false, key, batch->size);
      }
    }
    StepStats stats;
    for (int d = 0; d < run_.ranks(); ++d) {
      on(d);
      stats += replicas_[d]->take_stats();
    }
    return stats;
  }

  Run& run_;
  std::uint64_t step_;
  TargetWatch target_;
  int rank_ = 0;  // the device being driven
  std::vector<std::unique_ptr<Replica>> replicas_;
  Batch batch_;                       // the step's global batch, as device 0 gets it
  std::vector<std::uint32_t> chunks_;  // its rows per device
};

}  // namespace

void train_dp(Run& run) {
  DpLoop loop(run);
  loop();
}

}  // namespace mnist_mt
