#include "run.hpp"

#include <algorithm>
#include <string>

#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/sampler.hpp"

namespace mnist_mt {
namespace {

void check(const TrainConfig& config, const Dataset& data) {
  if (config.devices.empty()) throw InputError("no device to train on");
  if (config.batch == 0) throw InputError("--batch-size: must be at least 1");
  const std::uint64_t global = std::uint64_t{config.batch} * config.devices.size();
  if (global > data.train.size()) {
    throw InputError("--batch-size: the global batch, " + std::to_string(global) + " images, exceeds the " +
                     std::to_string(data.train.size()) + " training images");
  }
  if (config.fault && (config.fault->rank < 0 || config.fault->rank >= static_cast<int>(config.devices.size()))) {
    throw InputError("--inject-fault: no rank " + std::to_string(config.fault->rank));
  }
}

// The checkpoint's parameters, momentum and loop state (its seed too, so that a resumed
// run draws what an uninterrupted one would), or fresh parameters from the seed.
Checkpoint starting_point(const TrainConfig& config, const Dataset& data) {
  check(config, data);
  if (config.load) {
    try {
      return load_checkpoint(*config.load);
    } catch (const InputError& e) {
      throw InputError(std::string("--load: ") + e.what());
    }
  }
  Checkpoint start;
  start.params.resize(kParamCount);
  init_parameters(config.seed, start.params);
  start.seed = config.seed;
  return start;
}

std::vector<std::unique_ptr<Communicator>> communicators(Backend& backend,
                                                         const std::vector<std::unique_ptr<Device>>& devices) {
  std::vector<Device*> raw;
  for (const auto& d : devices) raw.push_back(d.get());
  return backend.make_communicators(raw);
}

bool is_aborted(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Aborted&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

Run::Run(Backend& backend, const Dataset& data, const TrainConfig& config)
    : backend(backend),
      data(data),
      config(config),
      start(starting_point(config, data)),
      devices(backend.make_devices(config.devices)),
      comms(communicators(backend, devices)),
      loaders(data, static_cast<std::uint32_t>(devices.size()), config.batch, start.seed),
      progress(config.progress, std::uint64_t{config.batch} * devices.size()) {
  if (config.metrics) metrics_.emplace(*config.metrics);
}

std::uint32_t Run::steps_in_epoch(std::uint32_t loader_steps) const {
  return config.max_steps > 0 ? std::min(loader_steps, config.max_steps) : loader_steps;
}

std::vector<std::uint32_t> Run::batch_sizes(int rank) const {
  std::vector<std::uint32_t> sizes{config.batch};
  if (!config.evaluate) return sizes;
  const ShardPlan test{data.test.size(), static_cast<std::uint32_t>(world()), config.batch, false};
  if (test.steps() == 0) return sizes;
  std::vector<std::uint32_t> positions(config.batch);
  const std::uint32_t last = test.shard(static_cast<std::uint32_t>(rank), test.steps() - 1, positions);
  if (last != 0 && last != config.batch) sizes.push_back(last);
  return sizes;
}

void Run::await_peers() {
  std::unique_lock lock(failures_mutex_);
  if (++ready_ == world()) peers_cv_.notify_all();
  peers_cv_.wait(lock, [&] { return ready_ >= world() || !failures_.empty(); });
  if (ready_ < world()) throw Aborted("a peer failed while it set up");
}

void Run::inject_fault(int rank, std::uint64_t step) const {
  if (config.fault && config.fault->rank == rank && config.fault->step == step) {
    throw RuntimeFailure("injected fault");
  }
}

StepStats Run::train_steps(EpochMetrics& m, std::uint32_t steps, bool report,
                           const std::function<StepStats(PhaseSeconds&)>& step) {
  if (report) progress.start_epoch(m.epoch, steps);
  StepStats total;
  Stopwatch clock;
  for (std::uint32_t k = 0; k < steps; ++k) {
    total += step(m.phase_seconds);
    if (report) progress.step(k + 1, total.loss_sum / total.samples);
  }
  m.seconds = clock.lap();
  m.steps = steps;
  return total;
}

void Run::end_epoch(const EpochMetrics& m, Replica& replica, std::uint64_t step) {
  result.epochs.push_back(m);
  if (metrics_) metrics_->write(m);
  progress.end_epoch(m);
  if (!config.save) return;
  Checkpoint checkpoint;
  checkpoint.params.resize(kParamCount);
  checkpoint.momentum.resize(kParamCount);
  replica.read_params(checkpoint.params);
  replica.read_momentum(checkpoint.momentum);
  checkpoint.epoch = m.epoch;
  checkpoint.step = step;
  checkpoint.seed = start.seed;
  save_checkpoint(*config.save, checkpoint);
}

void Run::fail(int rank, std::uint64_t step, std::exception_ptr error) {
  {
    std::lock_guard lock(failures_mutex_);
    failures_.push_back({rank, step, std::move(error)});
  }
  peers_cv_.notify_all();
  for (auto& c : comms) c->abort();
  loaders.cancel();
}

void Run::rethrow_failure() const {
  if (failures_.empty()) return;
  const auto root =
      std::find_if(failures_.begin(), failures_.end(), [](const Failure& f) { return !is_aborted(f.error); });
  const Failure& f = root != failures_.end() ? *root : failures_.front();
  const std::string where = "rank " + std::to_string(f.rank) + " failed at step " + std::to_string(f.step) + ": ";
  try {
    std::rethrow_exception(f.error);
  } catch (const InputError& e) {
    throw InputError(where + e.what());
  } catch (const std::exception& e) {
    throw RuntimeFailure(where + e.what());
  } catch (...) {
    throw RuntimeFailure(where + "unknown error");
  }
}

void set_results(EpochMetrics& m, const StepStats& train, const StepStats& test) {
  m.train_loss = train.loss_sum / train.samples;
  m.images_per_s = m.seconds > 0 ? train.samples / m.seconds : 0.0;
  m.test_loss = test.loss_sum / test.samples;
  m.test_accuracy = test.correct / test.samples;
}

void drain(Device& device) noexcept {
  try {
    device.synchronize();
  } catch (...) {
  }
}

}  // namespace mnist_mt
