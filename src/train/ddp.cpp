// DDP: a worker thread per device. Each gradient bucket's allreduce goes to the comm
// stream as soon as backward has written the bucket, while backward goes on; the
// optimizer waits for all of them.
#include <array>
#include <optional>
#include <string>
#include <thread>

#include "buckets.hpp"
#include "evaluate_shard.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "run.hpp"

namespace mnist_mt {
namespace {

class DdpWorker {
 public:
  DdpWorker(Run& run, int rank)
      : run_(run),
        rank_(rank),
        device_(*run.devices[rank]),
        comm_(*run.comms[rank]),
        buckets_(make_buckets(run.config.bucket_mb)),
        step_(run.start.step) {}

  void operator()() noexcept {
    try {
      device_.activate();
      replica_ = run_.backend.make_replica(device_, run_.config.batch);
      replica_->prepare(run_.batch_sizes(rank_));
      // No rank enters a collective while a peer still sets up (cuDNN's searches,
      // allocations): NCCL's kernels would hold the device while that peer waits for it.
      run_.await_peers();
      start();
      for (std::uint32_t epoch = run_.start.epoch; epoch < run_.last_epoch(); ++epoch) {
        if (!train_epoch(epoch)) break;
      }
      run_.beat(rank_, step_, Phase::kDone);
      if (rank_ == 0) {
        run_.result.params.resize(kParamCount);
        replica_->read_params(run_.result.params);
      }
    } catch (...) {
      run_.fail(rank_, step_, std::current_exception());
    }
    drain(device_);
  }

 private:
  // Rank 0's parameters reach every rank; momentum is the same everywhere already.
  void start() {
    if (rank_ == 0) replica_->write_params(run_.start.params);
    if (!run_.start.momentum.empty()) replica_->write_momentum(run_.start.momentum);
    device_.comm_wait_compute();
    comm_.broadcast(replica_->params(), kParamCount, 0);
    device_.compute_wait_comm();
  }

  // False when a stop request ended the run inside this epoch.
  bool train_epoch(std::uint32_t epoch) {
    const DropoutKey key{run_.start.seed, epoch};
    EpochMetrics m;
    m.epoch = epoch + 1;
    StepStats train;
    {
      const auto lease = run_.loaders.acquire(epoch, true);
      const std::uint32_t first = run_.first_step(epoch);
      skip(lease.loader(), first);
      Replica* rank0 = rank_ == 0 ? replica_.get() : nullptr;
      const bool done = run_.train_steps(m, first, run_.steps_in_epoch(lease.loader().steps()), rank0, step_, train,
                                         [&](PhaseSeconds& phase) {
                                           run_.inject_fault(rank_, step_);
                                           const std::optional<StepStats> stats = step(lease.loader(), key, phase);
                                           ++step_;
                                           if (!stats) ++m.skipped_steps;
                                           return stats.value_or(StepStats{});
                                         });
      if (!done) {
        if (rank_ == 0) run_.end_interrupted(*replica_, epoch, first + static_cast<std::uint32_t>(m.steps), step_);
        return false;
      }
    }
    run_.beat(rank_, step_, Phase::kEvaluate);
    const StepStats test = run_.config.evaluate ? evaluate(key) : StepStats{};
    std::array<double, 6> sums{train.loss_sum, train.correct, train.samples, test.loss_sum, test.correct, test.samples};
    run_.beat(rank_, step_, Phase::kCommWait);
    comm_.allreduce_host(sums);
    if (rank_ != 0) return true;
    set_results(m, {sums[0], sums[1], sums[2]}, {sums[3], sums[4], sums[5]});
    run_.end_epoch(m, *replica_, step_);
    return true;
  }

  // A resumed epoch: the batches of the steps the checkpoint has taken already.
  void skip(Loader& loader, std::uint32_t steps) {
    for (std::uint32_t k = 0; k < steps; ++k) {
      if (loader.next(rank_) == nullptr) throw Aborted("the loader was cancelled");
    }
  }

  // The host waits for the compute stream after forward and after backward to time
  // them; the comm stream runs on meanwhile, so what is left of it is the exposed wait.
  // Empty when the step's update was dropped (NanPolicy::kSkip).
  std::optional<StepStats> step(Loader& loader, const DropoutKey& key, PhaseSeconds& phase) {
    Stopwatch clock;
    run_.beat(rank_, step_, Phase::kData);
    run_.inject_stall(rank_, step_, StallPhase::kData);
    const Batch* batch = loader.next(rank_);
    if (batch == nullptr) throw Aborted("the loader was cancelled");
    phase.data_wait += clock.lap();

    run_.beat(rank_, step_, Phase::kForward);
    run_.inject_stall(rank_, step_, StallPhase::kCompute);
    run_.inject_nan(rank_, step_, *replica_);
    replica_->set_input(*batch);
    replica_->forward(true, key, batch->size);
    device_.wait_compute();
    const StepStats stats = replica_->take_stats();
    // Every rank's gradients reach every replica: a non-finite loss anywhere would be a
    // non-finite model everywhere.
    run_.check_loss(stats.loss_sum);
    phase.forward += clock.lap();

    run_.beat(rank_, step_, Phase::kCollective);  // a rank that never joins the step's allreduces
    run_.inject_stall(rank_, step_, StallPhase::kCollective);
    run_.beat(rank_, step_, Phase::kBackward);

    std::size_t next = 0;
    replica_->backward([&](int layer) {
      if (next < buckets_.size() && buckets_[next].ready_layer == layer) {
        device_.comm_wait_compute();
        comm_.allreduce(replica_->grads() + buckets_[next].offset, buckets_[next].count, ReduceOp::kAverage);
        ++next;
      }
    });
    // A bucket left out would leave the peers waiting in its allreduce.
    if (next != buckets_.size()) throw RuntimeFailure("backward did not report every layer's gradients");
    device_.wait_compute();
    phase.backward += clock.lap();

    run_.beat(rank_, step_, Phase::kCommWait);
    device_.synchronize();
    phase.comm_wait += clock.lap();

    run_.beat(rank_, step_, Phase::kOptimizer);
    device_.compute_wait_comm();
    const bool apply = run_.apply_update(rank_, stats.loss_sum, reduced_grad_norm(comm_, *replica_));
    if (apply) replica_->sgd_step(run_.config.sgd);
    run_.undo_nan(rank_, step_, apply, *replica_);
    device_.wait_compute();
    phase.optimizer += clock.lap();
    if (!apply) return std::nullopt;
    return stats;
  }

  // This rank's shard of the test set; the caller sums the ranks' stats.
  StepStats evaluate(const DropoutKey& key) {
    const auto lease = run_.loaders.acquire(key.epoch, false);
    return evaluate_shard(*replica_, lease.loader(), rank_, key, nullptr,
                          [this] { run_.beat(rank_, step_, Phase::kEvaluate); });
  }

  Run& run_;
  const int rank_;
  Device& device_;
  Communicator& comm_;
  const std::vector<Bucket> buckets_;
  std::uint64_t step_;  // global: optimizer steps taken
  std::unique_ptr<Replica> replica_;
};

}  // namespace

void train_ddp(Run& run) {
  std::vector<std::jthread> workers;
  try {
    for (int r = 0; r < run.world(); ++r) {
      workers.emplace_back([&run, r] {
        try {
          DdpWorker(run, r)();
        } catch (...) {  // the worker could not be made: its peers must not wait for it
          run.fail(r, run.start.step, std::current_exception());
        }
      });
    }
  } catch (...) {  // a thread that could not start: release those that did
    run.fail(static_cast<int>(workers.size()), run.start.step, std::current_exception());
  }
}

}  // namespace mnist_mt
