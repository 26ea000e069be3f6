// DDP: a worker thread per device. Each gradient bucket's allreduce goes to the comm
// stream as soon as backward has written the bucket, while backward goes on; the
// optimizer's work waits for all of them on the device. A world of one rank on a GPU
// exchanges nothing and leaves its comm stream idle. The host never waits for the
// device inside a step: the phases are timed by marks on the streams (a replayed step
// whole, unless TrainConfig::phase_times), the stats and the NaN guard's decisions stay
// on the device, and both are read every kReadEvery steps. On GPUs the step's work after
// its input copy is one CUDA graph (step_graphs.hpp).
#include <array>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "buckets.hpp"
#include "mnist_mt/evaluate_shard.hpp"
#include "metrics.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "run.hpp"
#include "step_graphs.hpp"
#include "step_timer.hpp"
#include "target.hpp"

namespace mnist_mt {
namespace {

// Loss, correct and sample sums from sums[0..2], as allreduce_host exchanges them.
StepStats stats_of(std::span<const double> sums) {
  StepStats s;
  s.loss_sum = sums[0];
  s.correct = sums[1];
  s.samples = sums[2];
  return s;
}

class DdpWorker {
 public:
  DdpWorker(Run& run, int rank)
      : run_(run),
        rank_(rank),
        device_(run.device(rank)),
        comm_(run.comm(rank)),
        factors_(run.factors()),
        buckets_(run.shards() == 1 && !factors_ && !comm_.keeps_reduced_squares()
                     ? std::vector<Bucket>{}
                     : make_buckets(run.config().bucket_mb, factors_ ? kFc1 : -1)),
        step_(run.start().step),
        timer_(device_, rank, run.trace()),
        graphs_(device_, comm_, run.phase_times()),
        guard_(run.update_guard(comm_)),
        target_(run.config()),
        first_shard_(run.first_shard(rank) - run.first_shard(0)),
        batches_(run.shard_count(rank)),
        kept_(run.shard_count(rank) - 1) {}

  void operator()() noexcept {
    try {
      device_.activate();
      replica_ = run_.backend().make_replica(device_, run_.shard_batch());
      replica_->hold_data(run_.samples());
      if (factors_) replica_->exchange_factors(run_.world());
      replica_->prepare(run_.batch_sizes(rank_));
      // No rank enters a collective while a peer still sets up (cuDNN's searches,
      // allocations): NCCL's kernels would hold the device while that peer waits for it.
      run_.await_peers();
      start();
      for (std::uint32_t epoch = run_.start().epoch; epoch < run_.last_epoch(); ++epoch) {
        if (!train_epoch(epoch)) break;
      }
      run_.beat(rank_, step_, Phase::kDone);
      if (rank_ == 0) {
        run_.keep_params(*replica_);
      }
    } catch (...) {
      run_.fail(rank_, step_, std::current_exception());
    }
    drain(device_);
  }

 private:
  // World rank 0's parameters reach every rank; the optimizer's state is the same
  // everywhere already.
  void start() {
    if (rank_ == 0) replica_->write_params(run_.start().params);  // world rank 0 is the broadcast's root
    if (!run_.start().state.first.empty()) replica_->write_state(run_.start().state);
    device_.comm_wait_compute();
    comm_.broadcast(replica_->params(), kParamCount, 0);
    device_.compute_wait_comm();
  }

  // False when a stop request ended the run inside this epoch, or it reached the target
  // accuracy.
  bool train_epoch(std::uint32_t epoch) {
    const DropoutKey key{run_.start().seed, epoch};
    EpochMetrics m;
    m.epoch = epoch + 1;
    StepStats train;
    std::uint32_t epoch_step = 0;  // where the target was reached in the epoch; 0: at its end
    {
      const auto lease = run_.loaders().acquire(epoch, true);
      const std::uint32_t first = run_.first_step(epoch);
      skip(lease.loader(), first);
      plan_epoch(lease.loader(), epoch, first, m);
      Replica* rank0 = run_.global(rank_) == 0 ? replica_.get() : nullptr;
      const bool done = run_.train_steps(
          rank_, m, first, run_.steps_in_epoch(lease.loader().steps()), rank0, step_, train,
          [&](PhaseSeconds& phase) {
            target_.step_started();
            run_.faults().fault(rank_, step_);
            step(lease.loader(), key, phase);
            ++step_;
          },
          [&](bool wait) { read(m, train, wait); },
          [&] {
            const double began = steady_seconds();
            const StepStats test = world_test(key);
            if (rank0 != nullptr) run_.report_evaluation(step_, test.correct / test.samples);
            return target_.evaluated(m, test, began, step_);
          });
      m.skipped_steps = train.skipped;
      if (!done) {
        if (rank0 != nullptr) run_.end_interrupted(*replica_, epoch, first + static_cast<std::uint32_t>(m.steps), step_);
        return false;
      }
      if (target_.reached()) epoch_step = first + static_cast<std::uint32_t>(m.steps);
    }
    // The epoch's end: its test stats, unless the target was reached inside it.
    const double began = steady_seconds();
    run_.beat(rank_, step_, Phase::kEvaluate);
    const bool evaluate_now = run_.config().evaluate && !target_.reached();
    const StepStats test = evaluate_now ? evaluate(key) : StepStats{};
    std::array<double, 6> sums{train.loss_sum, train.correct, train.samples, test.loss_sum, test.correct, test.samples};
    run_.beat(rank_, step_, Phase::kCommWait);
    comm_.allreduce_host(sums);
    const std::span<const double> world(sums);
    if (evaluate_now) target_.evaluated(m, stats_of(world.subspan(3)), began, step_);
    const bool go_on = !target_.reached();
    if (run_.global(rank_) != 0) return go_on;
    if (graphs_.nodes() != 0) m.graph_nodes = graphs_.nodes();
    set_results(m, stats_of(world), epoch_step != 0 ? target_.reached_test() : stats_of(world.subspan(3)));
    run_.end_epoch(m, *replica_, step_, epoch_step);
    return go_on;
  }

  // The world's test stats: each rank evaluates its shard, the sums are exchanged.
  StepStats world_test(const DropoutKey& key) {
    run_.beat(rank_, step_, Phase::kEvaluate);
    const StepStats mine = evaluate(key);
    std::array<double, 3> sums{mine.loss_sum, mine.correct, mine.samples};
    run_.beat(rank_, step_, Phase::kCommWait);
    comm_.allreduce_host(sums);
    return stats_of(sums);
  }

  // A resumed epoch: the batches of the steps the checkpoint has taken already.
  void skip(Loader& loader, std::uint32_t steps) {
    for (std::uint32_t k = 0; k < steps; ++k) next_batches(loader);
  }

  // A GPU holding the data gathers each step's rows itself (Replica::plan_epoch). Every
  // rank does, or none: which steps record a new CUDA graph, and so join the host
  // collective of StepGraphs::run, must be the same on every rank.
  void plan_epoch(const Loader& loader, std::uint32_t epoch, std::uint32_t first, EpochMetrics& m) {
    const bool can = batches_.size() == 1 &&
                     replica_->plan_epoch(loader.split_images(), epoch, loader.rank_samples(first_shard_, first),
                                          run_.shard_batch());
    std::array<double, 1> ranks_planning{can ? 1.0 : 0.0};
    run_.beat(rank_, step_, Phase::kCommWait);  // the watchdog sees a rank that never comes
    comm_.allreduce_host(ranks_planning);
    m.planned_input = ranks_planning[0] == comm_.size();
    if (can && !m.planned_input) replica_->plan_epoch(nullptr, epoch, {}, run_.shard_batch());
  }

  // This rank's shards' batches of the next step (Run::shards), in batches_.
  void next_batches(Loader& loader) {
    for (std::size_t s = 0; s < batches_.size(); ++s) {
      batches_[s] = loader.next(first_shard_ + static_cast<std::uint32_t>(s));
      if (batches_[s] == nullptr) throw Aborted("the loader was cancelled");
    }
  }

  // Enqueues one step. The host waits only for the batch, and in set_input() for the
  // previous step's input copy, which bounds how far it runs ahead of the device (a
  // planned step copies nothing: only the reads of the stats every 16 steps hold it). (With
  // several shards, each later shard's set_input() waits for the shard before's copy,
  // which follows the previous step's work: such a rank runs ahead by less.)
  void step(Loader& loader, const DropoutKey& key, PhaseSeconds& phase) {
    run_.beat(rank_, step_, Phase::kData);
    run_.faults().stall(rank_, step_, StallPhase::kData);
    const double asked = steady_seconds();
    next_batches(loader);
    const double got = steady_seconds();
    phase.data_wait += got - asked;
    timer_.begin(step_, asked, got);

    run_.beat(rank_, step_, Phase::kForward);
    run_.faults().stall(rank_, step_, StallPhase::kCompute);
    run_.faults().nan(rank_, step_, *replica_);
    replica_->set_input(*batches_[0]);
    update_ = run_.update_options(step_);
    replica_->set_update_values(update_);
    // The host's part of the step ends here when a recording of it is replayed: a rank
    // that never joins the step's allreduces stalls before enqueueing any of its work.
    run_.beat(rank_, step_, Phase::kCollective);
    run_.faults().stall(rank_, step_, StallPhase::kCollective);
    const std::uint32_t rows = batches_[0]->size;
    const auto enqueue = [&] { enqueue_step(key, rows); };
    graphs_.run({rows, replica_->input_buffer(), key.seed}, timer_, std::ref(enqueue));
    phase.host_launch += steady_seconds() - got;
    run_.faults().undo_nan(rank_, step_, *replica_);
  }

  // The step's work after its input: forward, backward with each bucket's allreduce on
  // the comm stream as soon as backward has written the bucket, the guarded update.
  // A rank of several shards (CPU devices only, which record nothing) first runs forward
  // and backward of each shard but the last, keeping its gradients, and feeds it the next
  // shard's input; its forward phase holds that work too.
  void enqueue_step(const DropoutKey& key, std::uint32_t rows) {
    for (std::size_t s = 0; s < kept_.size(); ++s) {
      replica_->forward(true, key, rows);
      replica_->backward([](int) {});
      kept_[s] = replica_->keep_grads(s);
      replica_->set_input(*batches_[s + 1]);
      rows = batches_[s + 1]->size;
    }
    replica_->forward(true, key, rows);
    // With factors exchanged (no shards then: exchange.cpp), fc1's input goes to every
    // rank while backward runs, and the gradient at its output once backward has it.
    const Replica::Factors factors = factors_ ? replica_->factors() : Replica::Factors{};
    timer_.end_forward();
    if (factors_)
      on_comm(StepTimer::CommKind::kFc1Input,
              [&] { comm_.allgather(factors.input, factors.all_inputs, std::size_t{rows} * kFlat); });

    run_.beat(rank_, step_, Phase::kBackward);
    std::size_t next = 0;
    replica_->backward([&](int layer) {
      if (factors_ && layer == kFc1)
        on_comm(StepTimer::CommKind::kFc1OutputGrad, [&] {
          comm_.allgather(factors.output_grad, factors.all_output_grads, std::size_t{rows} * kHidden);
        });
      if (next < buckets_.size() && buckets_[next].ready_layer == layer) {
        on_comm(StepTimer::CommKind::kAllreduce, [&] { allreduce(buckets_[next]); });
        ++next;
      }
    });
    // A bucket left out would leave the peers waiting in its allreduce.
    if (next != buckets_.size()) throw RuntimeFailure("backward did not report every layer's gradients");
    timer_.end_backward();

    run_.beat(rank_, step_, Phase::kOptimizer);
    if (!buckets_.empty()) device_.compute_wait_comm();
    timer_.end_comm_wait();
    // fc1's gradients over the world's rows (every rank's batch has `rows`: drop_last).
    if (factors_) replica_->grads_from_factors(rows * static_cast<std::uint32_t>(run_.world()));
    // Every rank's gradients reach every replica: a non-finite loss or norm anywhere
    // would be a non-finite model everywhere, so the device drops the update itself.
    replica_->guarded_update(update_, guard_);
    timer_.end_step();
  }

  // Enqueues `exchange` on the comm stream behind the compute stream's work so far, timed
  // as a comm span of `kind`.
  template <class F>
  void on_comm(StepTimer::CommKind kind, F&& exchange) {
    device_.comm_wait_compute();
    timer_.begin_comm(kind);
    exchange();
    timer_.end_comm();
  }

  // A bucket's gradients averaged over the world's shards, into grads().
  void allreduce(const Bucket& bucket) {
    if (kept_.empty()) {
      comm_.allreduce(replica_->grads() + bucket.offset, bucket.count, ReduceOp::kAverage);
      return;
    }
    std::vector<float*> parts;
    parts.reserve(kept_.size() + 1);
    for (float* kept : kept_) parts.push_back(kept + bucket.offset);
    parts.push_back(replica_->grads() + bucket.offset);
    comm_.allreduce_shards(parts, bucket.count, ReduceOp::kAverage);
  }

  // The stats since the last read and the phase times of the steps the device has
  // passed. A snapshot is taken now and read at the next call, kReadEvery steps on, when
  // the device is long past it; `wait` reads the new one too (epoch end, saves).
  void read(EpochMetrics& m, StepStats& total, bool wait) {
    const std::optional<std::uint64_t> previous = std::exchange(unread_, replica_->snapshot_stats());
    if (previous) add(total, *replica_->read_stats(*previous, true));
    if (wait) {
      add(total, *replica_->read_stats(*unread_, true));
      unread_.reset();
    }
    timer_.harvest(m.phase_seconds);
  }

  void add(StepStats& total, const StepStats& stats) {
    total += stats;
    if (stats.non_finite) run_.on_non_finite(comm_, *stats.non_finite);
  }

  // This rank's shard of the test set; the caller sums the ranks' stats.
  StepStats evaluate(const DropoutKey& key) {
    const auto lease = run_.loaders().acquire(key.epoch, false);
    return evaluate_shard(*replica_, lease.loader(), rank_, key, nullptr,
                          [this] { run_.beat(rank_, step_, Phase::kEvaluate); });
  }

  Run& run_;
  const int rank_;
  Device& device_;
  Communicator& comm_;
  const bool factors_;  // fc1's factors exchanged instead of its gradient (Run::factors)
  // None for a world of one rank and one shard, whose gradients are their own average:
  // no collective, and nothing on the comm stream, in its steps. Not where the
  // communicator's pass is also the norm's (CPU devices: keeps_reduced_squares), which
  // runs beside backward. make_buckets() gives at least one.
  const std::vector<Bucket> buckets_;
  std::uint64_t step_;  // global: optimizer steps taken
  std::unique_ptr<Replica> replica_;
  StepTimer timer_;
  StepGraphs graphs_;  // after replica_: its recordings are released first
  const UpdateGuard guard_;
  OptimizerOptions update_;  // the step's, with the schedule's values
  TargetWatch target_;
  std::optional<std::uint64_t> unread_;  // the snapshot the next read() reads
  // This rank's first shard as the loader numbers them: from this process's first.
  const std::uint32_t first_shard_;
  std::vector<const Batch*> batches_;   // the step's batch of each of the rank's shards
  std::vector<float*> kept_;            // the gradients of each shard but the last (Replica::keep_grads)
};

}  // namespace

void train_ddp(Run& run) {
  std::vector<std::jthread> workers;
  try {
    for (int r = 0; r < run.ranks(); ++r) {
      workers.emplace_back([&run, r] {
        try {
          DdpWorker(run, r)();
        } catch (...) {  // the worker could not be made: its peers must not wait for it
          run.fail(r, run.start().step, std::current_exception());
        }
      });
    }
  } catch (...) {  // a thread that could not start: release those that did
    run.fail(static_cast<int>(workers.size()), run.start().step, std::current_exception());
  }
}

}  // namespace mnist_mt
