#include "run.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <span>
#include <string>

#include "mnist_mt/local_group.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/sampler.hpp"

namespace mnist_mt {
namespace {

// The backend's collectives for ranks on devices of their own; the local group, on any
// backend, when ranks share a device (an id repeats), which NCCL cannot serve.
std::vector<std::unique_ptr<Communicator>> communicators(Backend& backend, std::span<const int> ids,
                                                         const std::vector<std::unique_ptr<Device>>& devices,
                                                         const Place& place) {
  std::vector<Device*> raw;
  for (const auto& d : devices) raw.push_back(d.get());
  if (std::set<int>(ids.begin(), ids.end()).size() == ids.size()) return backend.make_communicators(raw, place);
  if (place.process_count() > 1) throw SameOnEveryProcess("ranks that share a device run in one process only");
  return make_local_communicators(raw, place.shards);
}

// How long a released rank may take to return before the process gives up on it.
constexpr auto kGrace = std::chrono::seconds(3);

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", seconds);
  return text;
}

std::uint64_t peak_rss_bytes() {
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace

Run::Run(Backend& backend, const Dataset& data, const TrainConfig& config)
    : backend_(backend),
      data_(data),
      samples_{data.train.samples(), data.test.samples()},
      config_(config),
      place_(place_of(config, data, backend)),
      start_(starting_point(config, data, place_.world)),
      layout_(layout_of(config, place_, start_, backend)),
      factors_(exchanges_factors(config, place_, layout_.shards, backend)),
      devices_(backend.make_devices(config.devices)),
      comms_(communicators(backend, config.devices, devices_, sharded_place())),
      loaders_(data, train_shards(), test_shards(), start_.seed, static_cast<std::uint32_t>(devices_.size())),
      progress_(config.progress, std::uint64_t{config.batch} * static_cast<std::uint64_t>(place_.world)),
      saver_(config.keep),
      schedule_(config.schedule, config.optimizer, steps_in_epoch(training_steps()), config.epochs),
      failures_(ranks(), place_.first_rank, place_.processes ? place_.processes->host(place_.process()) : "",
                [this] { abort_collectives(); loaders_.cancel(); }),
      stop_line_(ranks()),
      faults_(config.faults, place_.first_rank, failures_) {
  agree_on_start(start_, place_);
  if (start_.test_accuracy && start_.dataset == config_.data_name)
    measured_ = Measured{start_.epoch, start_.epoch_step, *start_.test_accuracy};
  // World rank 0's process writes the files and speaks.
  if (!layout_.note.empty() && config_.progress != nullptr && place_.process() == 0)
    *config_.progress << layout_.note << "\n";
  if (config_.progress != nullptr && place_.process() == 0)
    for (const std::string& note : config_.resume_notes) *config_.progress << note << "\n";
  if (config_.load && start_.world != 0 && start_.fc1_factors != factors_ && config_.epochs > start_.epoch &&
      config_.progress != nullptr && place_.process() == 0)
    *config_.progress << "mnist_mt: resuming a checkpoint whose fc1 gradients were exchanged as "
                      << (start_.fc1_factors ? "factors" : "gradients") << " with " << (factors_ ? "factors" : "gradients")
                      << ": fc1's sums rounded otherwise (not bit for bit)\n";
  if (config_.load && start_.bf16_products != bf16_products() && config_.epochs > start_.epoch &&
      config_.progress != nullptr && place_.process() == 0)
    *config_.progress << "mnist_mt: resuming a checkpoint trained with " << precision_name(start_.bf16_products)
                      << " products with " << precision_name(bf16_products())
                      << " ones (--precision): not bit for bit\n";
  if (config_.metrics && place_.process() == 0) metrics_.emplace(*config_.metrics, config_.load.has_value(), start_.epoch);
  if (config_.trace && place_.process() == 0) trace_.emplace(*config_.trace, start_.step, config_.trace_steps);
  Watchdog::Hooks hooks;
  hooks.on_stall = [this](int rank, std::uint64_t step, Phase phase, double seconds) {
    const std::string timeout = seconds_text(config_.timeout_s);
    if (const std::string missing = missing_processes(); !missing.empty()) {
      fail(rank, step,
           std::make_exception_ptr(ProcessesSilent(
               missing + " sent nothing for " + seconds_text(seconds) + " s (timeout " + timeout +
               " s): it failed or stopped; rank " + std::to_string(global(rank)) + " (host " +
               place_.processes->host(place_.process()) + ") waited for it at step " + std::to_string(step))));
      return;
    }
    fail(rank, step,
         std::make_exception_ptr(RuntimeFailure("stalled in phase " + std::string(phase_name(phase)) +
                                                ": no progress for " + seconds_text(seconds) + " s (timeout " +
                                                timeout + " s)")));
  };
  hooks.tick = [this] { return watch_tick(); };
  hooks.on_hung = [this] { exit_hung(); };
  watchdog_ = std::make_unique<Watchdog>(ranks(), config_.timeout_s, kGrace, std::move(hooks));
}

std::string Run::missing_processes() const {
  return place_.processes ? process_names(*place_.processes, place_.processes->waiting_for(), ranks()) : "";
}

// A second signal (across processes the first, StopRequest): every rank released now.
bool Run::watch_tick() {
  if (config_.stop == nullptr || config_.stop->abort_signal() == 0) return false;
  const int signal = config_.stop->abort_signal();
  fail(-1, 0, std::make_exception_ptr(Interrupted("aborted by signal " + std::to_string(signal), signal)));
  return true;
}

// A rank that does not return once released (stuck in a kernel) cannot be joined: the
// process reports the first failure and ends without it. No file is half-written:
// checkpoints appear only by rename.
void Run::exit_hung() const {
  int code = 3;
  try {
    rethrow_failure();
  } catch (const Interrupted& e) {
    std::fprintf(stderr, "mnist_mt: error: %s\n", e.what());
    code = 128 + e.signal();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist_mt: error: %s\n", e.what());
  }
  std::fflush(stdout);
  if (place_.processes) place_.processes->abort(code);  // the other processes too
  std::_Exit(code);
}

void Run::abort_collectives() {
  for (auto& c : comms_) c->abort();
}

void Run::keep_params(Replica& replica) {
  result_.params.resize(kParamCount);
  replica.read_params(result_.params);
}

std::uint32_t Run::training_steps() const {
  return static_cast<std::uint32_t>(data_.train.size() / (std::uint64_t{shard_batch()} * shards()));
}

std::uint32_t Run::steps_in_epoch(std::uint32_t loader_steps) const {
  return mnist_mt::steps_in_epoch(loader_steps, config_.max_steps);
}

// Global rank g's block starts at g * (S / W) + min(g, S % W): the first S % W ranks take
// one shard more. With a shard a rank, shard g.
std::uint32_t Run::first_shard(int rank) const {
  const auto g = static_cast<std::uint32_t>(global(rank)), w = static_cast<std::uint32_t>(world());
  return g * (shards() / w) + std::min(g, shards() % w);
}

Place Run::sharded_place() const {
  Place p = place_;
  if (shards() != static_cast<std::uint32_t>(world())) {
    for (int r = 0; r < static_cast<int>(config_.devices.size()); ++r)
      p.shards.push_back(static_cast<int>(shard_count(r)));
  }
  return p;
}

SharedLoaders::Shards Run::train_shards() const {
  const auto ranks = static_cast<int>(config_.devices.size());
  return {shards(), shard_batch(), first_shard(0), first_shard(ranks) - first_shard(0)};
}

// Evaluation: a shard a rank, in batches the replica holds (with shards, the
// checkpoint's batch; its figures are then the uninterrupted run's within rounding).
SharedLoaders::Shards Run::test_shards() const {
  return {static_cast<std::uint32_t>(world()), shard_batch(), static_cast<std::uint32_t>(place_.first_rank),
          static_cast<std::uint32_t>(config_.devices.size())};
}

std::vector<std::uint32_t> Run::batch_sizes(int rank) const {
  std::vector<std::uint32_t> sizes{shard_batch()};
  if (!config_.evaluate) return sizes;
  const ShardPlan test{data_.test.size(), static_cast<std::uint32_t>(world()), shard_batch(), false};
  if (test.steps() == 0) return sizes;
  std::vector<std::uint32_t> positions(shard_batch());
  const std::uint32_t last = test.shard(static_cast<std::uint32_t>(global(rank)), test.steps() - 1, positions);
  if (last != 0 && last != shard_batch()) sizes.push_back(last);
  return sizes;
}

void Run::check_loss(double loss_sum) const {
  if (config_.on_nan == NanPolicy::kStop && !std::isfinite(loss_sum)) {
    throw RuntimeFailure("non-finite training loss " + std::to_string(loss_sum));
  }
}

// A non-finite norm is the same on every rank: with skip each drops the update; with stop
// rank 0 fails the run and the others, their update dropped too, wait to be released. A
// non-finite loss whose gradients stayed finite cannot be seen by the other ranks, so it
// fails the run whatever the policy.
bool Run::apply_update(int rank, double loss_sum, double grad_norm) const {
  if (std::isfinite(grad_norm)) {
    if (!std::isfinite(loss_sum)) {
      throw RuntimeFailure("non-finite training loss " + std::to_string(loss_sum) +
                           " with finite gradients: the step cannot be skipped on every rank alike");
    }
    return true;
  }
  if (config_.on_nan == NanPolicy::kStop && rank == 0) {
    throw RuntimeFailure("non-finite gradient norm " + std::to_string(grad_norm) + " (the ranks' gradients reduced)");
  }
  return false;
}

void Run::on_non_finite(Communicator& comm, const NonFiniteStep& step) {
  if (std::isfinite(step.grad_norm)) {
    throw StepFailure(step.step, "non-finite training loss " + std::to_string(step.loss_sum) +
                                     " with finite gradients: the step cannot be skipped on every rank alike");
  }
  if (config_.on_nan == NanPolicy::kSkip) return;
  std::vector<double> bad(comm.size(), 0.0);
  bad[static_cast<std::size_t>(comm.rank())] = std::isfinite(step.loss_sum) ? 0.0 : 1.0;
  comm.allreduce_host(bad);
  const int first_bad = static_cast<int>(std::find(bad.begin(), bad.end(), 1.0) - bad.begin());
  if (first_bad == comm.rank()) throw StepFailure(step.step, "non-finite training loss " + std::to_string(step.loss_sum));
  if (first_bad == comm.size() && comm.rank() == 0) {
    throw StepFailure(step.step, "non-finite gradient norm " + std::to_string(step.grad_norm) +
                                     " (the ranks' gradients reduced)");
  }
  // Once the report is recorded: an abort now could not turn it into an Aborted of its own.
  failures_.await_report();
  throw Aborted("another rank reports the non-finite step");
}

UpdateGuard Run::update_guard(Communicator& comm) const {
  // A worker's replica makes its first guarded update at the run's first step.
  // With fc1's factors exchanged the communicator's pass misses fc1: the replica takes the
  // norm itself (fc1's part from the factors).
  if (factors_) return {start_.step, config_.on_nan == NanPolicy::kStop, {}};
  return {start_.step, config_.on_nan == NanPolicy::kStop, [&comm] { return comm.take_reduced_squares(); }};
}

bool Run::train_steps(int rank, EpochMetrics& m, std::uint32_t first, std::uint32_t steps, Replica* rank0,
                      std::uint64_t& global, const StepStats& total, const std::function<void(PhaseSeconds&)>& step,
                      const std::function<void(bool wait)>& read, const std::function<bool()>& evaluate) {
  if (rank0 != nullptr) progress_.start_epoch(m.epoch, steps, first);
  Stopwatch clock;
  double evaluating = 0;  // inside the epoch (eval_every), left out of its training time
  bool done = true;
  std::uint32_t k = first;
  for (; k < steps; ++k) {
    if (stop_line_.stop_before(rank, global, config_.stop != nullptr && config_.stop->stop_signal() != 0)) {
      done = false;
      break;
    }
    step(m.phase_seconds);
    ++m.steps;
    const bool save_now = config_.save && config_.save_every > 0 && global % config_.save_every == 0 && k + 1 < steps;
    if (save_now || global % kReadEvery == 0) {
      read(save_now);  // a checkpoint only of steps known to be finite
      if (rank0 != nullptr && total.samples > 0 && k + 1 < steps) progress_.step(k + 1, total.loss_sum / total.samples);
    }
    if (rank0 != nullptr && save_now) save(*rank0, m.epoch - 1, k + 1, global, *config_.save);
    if (config_.target_accuracy && config_.eval_every > 0 && global % config_.eval_every == 0 && k + 1 < steps) {
      read(true);
      const double began = steady_seconds();
      const bool reached = evaluate();
      evaluating += steady_seconds() - began;
      if (reached) {
        ++k;
        break;
      }
    }
  }
  read(true);
  if (rank0 != nullptr && done && total.samples > 0) progress_.step(k, total.loss_sum / total.samples);
  m.seconds = clock.lap() - evaluating;
  return done;
}

void Run::save(Replica& replica, std::uint32_t epoch, std::uint32_t epoch_step, std::uint64_t step,
               const std::filesystem::path& path) {
  beat(0, step, Phase::kSave);
  Checkpoint checkpoint;
  checkpoint.params.resize(kParamCount);
  replica.read_params(checkpoint.params);
  checkpoint.optimizer = config_.optimizer.kind;
  checkpoint.state = replica.read_state();
  if (state_buffers(checkpoint.optimizer) < 2) checkpoint.state.second.clear();
  checkpoint.epoch = epoch;
  checkpoint.epoch_step = epoch_step;
  checkpoint.step = step;
  checkpoint.seed = start_.seed;
  checkpoint.world = shards();
  checkpoint.batch = shard_batch();
  // fc1's product over the world's rows is no sum in shard order.
  checkpoint.shard_order = sums_in_shard_order(config_, place_, backend_) && !factors_;
  checkpoint.fc1_factors = factors_;
  checkpoint.bf16_products = bf16_products();
  if (measured_ && measured_->epoch == epoch && measured_->epoch_step == epoch_step)
    checkpoint.test_accuracy = measured_->accuracy;
  checkpoint.settings = trajectory_settings(config_);
  checkpoint.dataset = config_.data_name;
  saver_.save(path, checkpoint);
}

void Run::end_epoch(EpochMetrics m, Replica& replica, std::uint64_t step, std::uint32_t epoch_step) {
  m.peak_rss_bytes = peak_rss_bytes();
  m.bf16_products = bf16_products();
  m.tf32 = backend_.tf32();
  if (config_.mode == Mode::kDdp) {
    m.fc1_factors = factors_;
    m.bytes_sent_per_step = bytes_sent_per_step(factors_, config_.batch, place_.world);
  }
  result_.epochs.push_back(m);
  if (metrics_) runtime_write([&] { metrics_->write(m); });
  progress_.end_epoch(m);
  // A position inside the epoch counts the epochs before it as completed.
  const std::uint32_t epoch = epoch_step == 0 ? m.epoch : m.epoch - 1;
  if (std::isfinite(m.test_accuracy)) measured_ = Measured{epoch, epoch_step, m.test_accuracy};
  if (config_.save) save(replica, epoch, epoch_step, step, *config_.save);
}

void Run::end_interrupted(Replica& replica, std::uint32_t epoch, std::uint32_t epoch_step, std::uint64_t step) {
  const std::filesystem::path path = config_.save.value_or(config_.interrupt_save);
  if (!path.empty()) save(replica, epoch, epoch_step, step, path);  // empty: nowhere to save
  result_.interrupted = Interruption{config_.stop->stop_signal(), path, epoch, epoch_step, step};
}

void set_results(EpochMetrics& m, const StepStats& train, const StepStats& test) {
  m.train_loss = train.loss_sum / train.samples;
  m.images_per_s = m.seconds > 0 ? train.samples / m.seconds : 0.0;
  m.test_loss = test.loss_sum / test.samples;
  m.test_accuracy = test.correct / test.samples;
}

double reduced_grad_norm(Communicator& comm, Replica& replica) {
  const std::optional<double> squares = comm.take_reduced_squares();
  return squares ? std::sqrt(*squares) : replica.grad_norm();
}

void drain(Device& device) noexcept {
  try {
    device.synchronize();
  } catch (...) {
  }
}

}  // namespace mnist_mt
