#include <cmath>
#include <sstream>
#include <string>

#include "mnist_mt/error.hpp"
#include "mnist_mt/trainer.hpp"
#include "saver.hpp"

namespace mnist_mt {
namespace {

std::string show(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

void check_rate(double value, const char* name, const char* input) {
  if (!std::isfinite(value) || value < 0) {
    throw InputError(std::string(name) + " " + show(value) + " must be a finite number >= 0", input);
  }
}

// torch.optim's own checks: rates >= 0, betas in [0, 1), Nesterov with momentum.
void check_optimizer(const OptimizerOptions& o) {
  check_rate(o.lr, "learning rate", "optimizer.lr");
  check_rate(o.momentum, "momentum", "optimizer.momentum");
  check_rate(o.weight_decay, "weight decay", "optimizer.weight_decay");
  check_rate(o.eps, "epsilon", "optimizer.eps");
  const bool sgd = o.kind == OptimizerKind::kSgd;
  if (!sgd && o.momentum != 0)
    throw InputError("momentum is SGD's: the " + std::string(optimizer_name(o.kind)) + " optimizer has none",
                     "optimizer.momentum");
  if (o.nesterov && (!sgd || !(o.momentum > 0)))
    throw InputError("Nesterov momentum needs the sgd optimizer and a momentum above 0", "optimizer.nesterov");
  for (const double beta : {o.beta1, o.beta2})
    if (!(beta >= 0 && beta < 1))
      throw InputError("beta " + show(beta) + " must be at least 0 and below 1", "optimizer.betas");
  if (!(o.rho >= 0 && o.rho <= 1)) throw InputError("rho " + show(o.rho) + " must be between 0 and 1", "optimizer.rho");
  // torch.optim takes 0, but then the first update divides 0 by 0 wherever a gradient
  // element is 0 (a ReLU that never fired) and the model is NaN from step 1 on.
  if (!sgd && !(static_cast<float>(o.eps) > 0))
    throw InputError("epsilon " + show(o.eps) + " must be above 0 (as a float) for " + std::string(optimizer_name(o.kind)) +
                         ": with 0 its first update divides 0 by 0 wherever a gradient element is 0",
                     "optimizer.eps");
}

void check_rank(const char* what, int rank, std::size_t world, const char* input) {
  if (rank < 0 || rank >= static_cast<int>(world)) {
    throw InputError(std::string(what) + ": no rank " + std::to_string(rank) + " among " + std::to_string(world),
                     input);
  }
}

}  // namespace

void check_train_config(const TrainConfig& config) {
  if (config.devices.empty()) throw InputError("no device to train on", "devices");
  if (config.batch == 0) throw InputError("batch size 0 must be positive", "batch");
  check_optimizer(config.optimizer);
  check_schedule(config.schedule);
  if (config.target_accuracy && !(*config.target_accuracy > 0 && *config.target_accuracy <= 1))
    throw InputError("target accuracy " + show(*config.target_accuracy * 100) + "% must be above 0% and at most 100%",
                     "target_accuracy");
  if (config.target_accuracy && !config.evaluate)
    throw InputError("a target accuracy needs the test set evaluated", "target_accuracy");
  if (config.eval_every > 0 && !config.target_accuracy)
    throw InputError("evaluating every " + std::to_string(config.eval_every) + " steps needs a target accuracy",
                     "eval_every");
  if (!(config.bucket_mb > 0) || !std::isfinite(config.bucket_mb)) {
    throw InputError("bucket cap " + show(config.bucket_mb) + " MiB must be a positive number", "bucket_mb");
  }
  if (!(config.timeout_s >= 0) || !std::isfinite(config.timeout_s)) {
    throw InputError("timeout " + show(config.timeout_s) + " s must be a finite number of seconds >= 0", "timeout_s");
  }
  if (config.keep == 0) throw InputError("0 checkpoints to keep: must be at least 1", "keep");
  if (config.keep > 1 && !config.save) {
    throw InputError("keeping " + std::to_string(config.keep) + " checkpoints needs a checkpoint path", "keep");
  }
  if (config.save_every > 0 && !config.save) {
    throw InputError("saving every " + std::to_string(config.save_every) + " steps needs a checkpoint path",
                     "save_every");
  }
  if (config.trace && config.mode != Mode::kDdp) throw InputError("a trace is recorded in ddp mode only", "trace");
  if (config.trace && config.trace_steps == 0) throw InputError("tracing 0 steps: must be at least 1", "trace_steps");
  const Faults& hooks = config.faults;
  // World ranks: every process runs as many ranks (checked when the run starts).
  const std::size_t world = config.devices.size() * static_cast<std::size_t>(config.processes ? config.processes->count() : 1);
  if (hooks.fault) check_rank("injected fault", hooks.fault->rank, world, "fault");
  if (hooks.stall) check_rank("injected stall", hooks.stall->rank, world, "stall");
  if (hooks.nan) check_rank("injected NaN", hooks.nan->rank, world, "nan");
  // An unwritable output is found now, not after the first epoch; by world rank 0's
  // process, the one that writes them.
  if (config.processes != nullptr && config.processes->index() != 0) return;
  if (config.save) check_output_path(*config.save, "checkpoint", "save");
  if (config.metrics) check_output_path(*config.metrics, "metrics file", "metrics");
  if (config.trace) check_output_path(*config.trace, "trace file", "trace");
}

}  // namespace mnist_mt
