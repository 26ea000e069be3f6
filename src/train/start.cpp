#include "start.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt {
namespace {

void check(const TrainConfig& config, const Dataset& data, int world) {
  check_train_config(config);
  // A run of no epochs only evaluates: its batches shard the test set.
  const bool evaluating = config.epochs == 0;
  const std::size_t images = evaluating ? data.test.size() : data.train.size();
  const std::uint64_t global = std::uint64_t{config.batch} * static_cast<std::uint64_t>(world);
  if (global > images) {
    throw InputError("the global batch, " + std::to_string(global) + " images (batch size " +
                         std::to_string(config.batch) + " on " + std::to_string(world) + " ranks), exceeds the " +
                         std::to_string(images) + (evaluating ? " test images" : " training images"),
                     "batch");
  }
}

// A checkpoint's position that this run can continue from: a step within its epoch (of
// its global batch), and a step count with room for every step the run adds to it.
void check_position(const Checkpoint& c, const TrainConfig& config, const Dataset& data, int world) {
  if (config.epochs == 0) return;  // evaluation reads the weights only
  const std::string file = config.load->string();
  const std::uint64_t global =
      c.global_batch() != 0 ? c.global_batch() : std::uint64_t{config.batch} * static_cast<std::uint64_t>(world);
  const std::uint64_t per_epoch = data.train.size() / global;
  if (c.epoch_step != 0 && c.epoch_step >= per_epoch)
    throw InputError(file + ": its position, step " + std::to_string(c.epoch_step) + " of epoch " +
                         std::to_string(c.epoch + 1) + ", is past the end of an epoch of " +
                         std::to_string(per_epoch) + " steps of " + std::to_string(global) + " images",
                     "load");
  // (A position past --max-steps resumes as an epoch of no steps:
  // CliTrain.AnEpochWithNoStepsPrintsNoNan.)
  const std::uint64_t run_epoch = steps_in_epoch(static_cast<std::uint32_t>(per_epoch), config.max_steps);
  // One-cycle and cosine end at the run's last step (--epochs x the steps of an epoch);
  // PyTorch's OneCycleLR refuses a step past it, and a cosine past it would rise again.
  const ScheduleKind kind = config.schedule.kind;
  const std::uint64_t schedule_steps = run_epoch * config.epochs;
  if (config.epochs > c.epoch && (kind == ScheduleKind::kOneCycle || kind == ScheduleKind::kCosine) &&
      c.step >= schedule_steps)
    throw InputError(file + ": its step count, " + std::to_string(c.step) + ", is past the end of this run's " +
                         (kind == ScheduleKind::kOneCycle ? "one-cycle" : "cosine") + " schedule of " +
                         std::to_string(schedule_steps) + " steps (--epochs x the steps of an epoch)",
                     "load");
  if (!c.state.first.empty() && c.optimizer != config.optimizer.kind)
    throw InputError(file + " holds the state of the " + std::string(optimizer_name(c.optimizer)) +
                         " optimizer, this run's is " + std::string(optimizer_name(config.optimizer.kind)) +
                         ": resume it with the same optimizer",
                     "load");
  const std::uint64_t left = config.epochs > c.epoch ? std::uint64_t{config.epochs - c.epoch} * per_epoch : 0;
  if (c.step > std::numeric_limits<std::uint64_t>::max() - left)
    throw InputError(file + ": its step count, " + std::to_string(c.step) + ", leaves no room for the " +
                         std::to_string(left) + " steps of " + std::to_string(config.epochs - c.epoch) +
                         " more epochs",
                     "load");
}

std::string ranks_text(std::uint64_t ranks, std::uint64_t batch) {
  return std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") + " x " + std::to_string(batch);
}

// What every process of a launch must run alike, a word each, named by its flag.
struct Setting {
  const char* flag;
  std::uint64_t value;
};

// FNV-1a, a word at a time: what the processes compare of their data and weights.
constexpr std::uint64_t kFnvBasis = 14695981039346656037ull;
constexpr std::uint64_t fnv1a(std::uint64_t hash, std::uint64_t word) { return (hash ^ word) * 1099511628211ull; }

// A data set's labels: the same data on every host, not only as many images.
std::uint64_t labels_hash(const Dataset& data) {
  std::uint64_t h = kFnvBasis;
  for (const auto* split : {&data.train, &data.test})
    for (const std::uint8_t label : split->labels) h = fnv1a(h, label);
  return h;
}

std::string process_text(const Processes& processes, int p) {
  return "process " + std::to_string(p) + " (host " + processes.host(p) + ")";
}

std::vector<Setting> settings(const TrainConfig& c, const Dataset& data, const Backend& backend) {
  const auto bits = [](double v) {
    if (v == 0) v = 0;  // -0 as typed is 0
    std::uint64_t u = 0;
    std::memcpy(&u, &v, sizeof u);
    return u;
  };
  const OptimizerOptions& o = c.optimizer;
  const ScheduleOptions& s = c.schedule;
  return {{"--cpu, --gpus", backend.name() == "cpu" ? 0u : 1u},
          {"--mode", static_cast<std::uint64_t>(c.mode)},
          {"--data (its training images)", data.train.size()},
          {"--data (its test images)", data.test.size()},
          {"--data (its labels)", labels_hash(data)},
          {"--epochs", c.epochs},
          {"--batch-size", c.batch},
          {"--optimizer", static_cast<std::uint64_t>(o.kind)},
          {"--lr", bits(o.lr)},
          {"--momentum", bits(o.momentum)},
          {"--weight-decay", bits(o.weight_decay)},
          {"--nesterov", o.nesterov ? 1u : 0u},
          {"--betas", bits(o.beta1)},
          {"--betas", bits(o.beta2)},
          {"--eps", bits(o.eps)},
          {"--rho", bits(o.rho)},
          {"--lr-schedule", static_cast<std::uint64_t>(s.kind)},
          {"--lr-step", s.step_epochs},
          {"--gamma", bits(s.gamma)},
          {"--warmup", s.warmup},
          {"--target-accuracy", c.target_accuracy ? bits(*c.target_accuracy) : ~std::uint64_t{0}},
          {"--eval-every", c.eval_every},
          {"--seed", c.seed},
          {"--bucket-mb", bits(c.bucket_mb)},
          {"--exchange", static_cast<std::uint64_t>(c.exchange)},
          {"--load", c.load ? 1u : 0u},
          {"--save-every", c.save_every},
          {"--on-nan", static_cast<std::uint64_t>(c.on_nan)},
          {"--max-steps", c.max_steps},
          {"--precision", static_cast<std::uint64_t>(backend.precision()) * 2 + (backend.tf32() ? 1 : 0)}};
}

}  // namespace

// Where this process's ranks are: the processes agree that each runs as many ranks, with
// the same settings.
Place place_of(const TrainConfig& config, const Dataset& data, const Backend& backend) {
  Place place;
  const int ranks = static_cast<int>(config.devices.size());
  place.world = ranks;
  const std::shared_ptr<Processes>& processes = config.processes;
  if (processes == nullptr || processes->count() == 1) return place;
  const int count = processes->count(), me = processes->index();
  const std::vector<Setting> alike = settings(config, data, backend);
  std::vector<std::uint64_t> mine{static_cast<std::uint64_t>(ranks)};
  for (const Setting& s : alike) mine.push_back(s.value);
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(count));
  // Within --timeout: a process that failed before this exchange has ended the launch,
  // but one that stopped has not.
  allgather_within(*processes, mine.data(), all.data(), mine.size() * sizeof(std::uint64_t), config.timeout_s,
                   "while the processes set up");
  const auto where = [&](int p) { return process_text(*processes, p); };
  for (int p = 0; p < count; ++p) {
    const std::uint64_t* theirs = all.data() + static_cast<std::size_t>(p) * mine.size();
    if (theirs[0] != mine[0]) {
      throw SameOnEveryProcess(where(p) + " runs " + std::to_string(theirs[0]) + " ranks and " + where(me) + " " +
                               std::to_string(ranks) + ": every process must run as many (--cpu, --gpus)");
    }
    for (std::size_t i = 0; i < alike.size(); ++i)
      if (theirs[i + 1] != mine[i + 1])
        throw SameOnEveryProcess(where(p) + " and " + where(me) + " were given different " + alike[i].flag +
                                 ": every process must train with the same flags");
  }
  // After the exchange, so that a launch of which one process alone asked for it is
  // refused by every process (a mode that differs above).
  if (config.mode == Mode::kDp) {
    throw SameOnEveryProcess("--mode dp drives every device from one thread of one process: run it without mpirun/srun");
  }
  place.processes = processes;
  place.timeout_s = config.timeout_s;
  place.first_rank = me * ranks;
  place.world = count * ranks;
  return place;
}

std::vector<std::pair<std::string, std::string>> trajectory_settings(const TrainConfig& config) {
  const OptimizerOptions& o = config.optimizer;
  const ScheduleOptions& s = config.schedule;
  std::vector<std::pair<std::string, std::string>> out{{"--optimizer", std::string(optimizer_name(o.kind))},
                                                       {"--lr", exact_text(o.lr)},
                                                       {"--weight-decay", exact_text(o.weight_decay)}};
  // A one-cycle schedule sets SGD's momentum and Adam's first beta at every step itself.
  const bool cycled = s.kind == ScheduleKind::kOneCycle;
  switch (o.kind) {
    case OptimizerKind::kSgd:
      if (!cycled) out.emplace_back("--momentum", exact_text(o.momentum));
      out.emplace_back("--nesterov", o.nesterov ? "true" : "false");
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      if (!cycled) out.emplace_back("--betas", exact_text(o.beta1) + "," + exact_text(o.beta2));
      out.emplace_back("--eps", exact_text(o.eps));
      break;
    case OptimizerKind::kAdadelta:
      out.emplace_back("--rho", exact_text(o.rho));
      out.emplace_back("--eps", exact_text(o.eps));
      break;
  }
  out.emplace_back("--lr-schedule", std::string(schedule_name(s.kind)));
  if (s.kind == ScheduleKind::kStep) {
    out.emplace_back("--lr-step", std::to_string(s.step_epochs));
    out.emplace_back("--gamma", exact_text(s.gamma));
  }
  if (s.kind == ScheduleKind::kOneCycle || s.kind == ScheduleKind::kCosine)
    out.emplace_back("--epochs", std::to_string(config.epochs));
  out.emplace_back("--max-steps", std::to_string(config.max_steps));
  out.emplace_back("--warmup", std::to_string(s.warmup));
  return out;
}

void agree_on_start(const Checkpoint& start, const Place& place) {
  if (place.processes == nullptr) return;
  Processes& processes = *place.processes;
  std::uint64_t params = kFnvBasis;
  for (const float v : start.params) {
    std::uint32_t u = 0;
    std::memcpy(&u, &v, sizeof u);
    params = fnv1a(params, u);
  }
  const std::vector<std::uint64_t> mine{start.epoch, start.epoch_step, start.step, start.seed, params};
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(processes.count()));
  allgather_within(processes, mine.data(), all.data(), mine.size() * sizeof(std::uint64_t), place.timeout_s,
                   "while the processes set up");
  const int me = processes.index();
  for (int p = 0; p < processes.count(); ++p)
    if (!std::equal(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(p * mine.size())))
      throw SameOnEveryProcess(process_text(processes, p) + " and " + process_text(processes, me) +
                               " start from different weights or steps (--load, --seed): every process must load the "
                               "same checkpoint");
}

// The checkpoint's parameters, optimizer state and loop state (its seed too, so that a resumed
// run draws what an uninterrupted one would), or fresh parameters from the seed.
Checkpoint starting_point(const TrainConfig& config, const Dataset& data, int world) {
  check(config, data, world);
  if (config.load) {
    Checkpoint loaded;
    try {
      loaded = load_checkpoint(*config.load);
    } catch (const InputError& e) {
      throw InputError(e.what(), "load");
    }
    check_position(loaded, config, data, world);
    return loaded;
  }
  Checkpoint start;
  start.params.resize(kParamCount);
  init_parameters(config.seed, start.params);
  start.seed = config.seed;
  return start;
}

// Whether a run adds its gradients shard by shard in world order, so that a run of fewer
// ranks can repeat its sums (Checkpoint::shard_order): DDP on CPU devices, in one process
// or with a rank a process (otherwise each process's sum comes first).
bool sums_in_shard_order(const TrainConfig& config, const Place& place, const Backend& backend) {
  return config.mode == Mode::kDdp && backend.sums_shards() &&
         (place.process_count() == 1 || config.devices.size() == 1);
}

// How the run's ranks compute the world's batch (ShardLayout): as the checkpoint's world
// did when it resumes one of the same global batch made by more ranks whose sums it can
// repeat, and a shard of the configured batch a rank otherwise.
ShardLayout layout_of(const TrainConfig& config, const Place& place, const Checkpoint& start, const Backend& backend) {
  const auto world = static_cast<std::uint32_t>(place.world);
  ShardLayout layout{world, config.batch, ""};
  // Nothing to match: a fresh run, or one with no step left (evaluation).
  if (!config.load || config.epochs <= start.epoch) return layout;
  const std::string file = config.load->string();
  const std::string position =
      "step " + std::to_string(start.epoch_step) + " of epoch " + std::to_string(start.epoch + 1);
  if (start.world == 0) {  // a file from before the layout was recorded
    if (start.epoch_step != 0)
      layout.note = "mnist_mt: " + file + " does not record its global batch: its position, " + position +
                    ", is taken in steps of this run's";
    return layout;
  }
  const std::uint64_t global = std::uint64_t{config.batch} * world;
  const std::string theirs = ranks_text(start.world, start.batch), ours = ranks_text(world, config.batch);
  if (start.global_batch() != global) {
    // A position in an epoch counts steps of the checkpoint's global batch.
    if (start.epoch_step != 0)
      throw InputError(file + " stopped after " + position + " with a global batch of " +
                           std::to_string(start.global_batch()) + " images (" + theirs + "), this run's is " +
                           std::to_string(global) + " (" + ours + "): resume it with the same global batch",
                       "load");
    return layout;
  }
  const std::string resuming = "mnist_mt: resuming a checkpoint of " + theirs + " on " + ours + ": ";
  const auto rounded_otherwise = [&](const std::string& why) {
    layout.note = resuming + "the same steps, their sums rounded otherwise (not bit for bit: " + why + ")";
    return layout;
  };
  if (start.world == world) {
    // The same layout adds the same sums, unless one side added them otherwise: ddp's
    // shard by shard against dp's (a factors checkpoint's own note is Run's).
    if (!start.fc1_factors && start.shard_order != sums_in_shard_order(config, place, backend))
      return rounded_otherwise(config.mode != Mode::kDdp ? "--mode dp" : "its sums were not added shard by shard");
    return layout;
  }
  const bool bf16 = backend.precision() == Precision::kBf16;
  const std::string why = config.mode != Mode::kDdp     ? "--mode dp"
                          : start.bf16_products != bf16 ? std::string("its products were ") +
                                                              precision_name(start.bf16_products)
                          : !backend.sums_shards()      ? backend.name() + " devices"
                          : place.process_count() > 1   ? "several processes"
                          : world > start.world         ? "more ranks than its"
                          : !start.shard_order          ? "its sums were not added shard by shard"
                                                        : "";
  if (!why.empty()) return rounded_otherwise(why);
  layout.shards = start.world;
  layout.batch = start.batch;
  const std::uint32_t fewest = start.world / world, most = fewest + (start.world % world != 0 ? 1 : 0);
  layout.note = resuming + "its " + std::to_string(start.world) + " shards of " + std::to_string(start.batch) +
                " computed " + std::to_string(fewest) + (most != fewest ? " or " + std::to_string(most) : "") +
                " a rank, in turn, and summed in its order" +
                (config.resume_changes_steps ? " (with the changes named below)" : ": bit for bit its run");
  return layout;
}

}  // namespace mnist_mt
