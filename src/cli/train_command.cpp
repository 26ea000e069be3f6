#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/trainer.hpp"
#include "outputs.hpp"
#include "signal_watch.hpp"

namespace mnist_mt::cli {
namespace {

// "RANK:STEP", or nothing.
std::optional<std::pair<int, std::uint64_t>> rank_step(std::string_view text) {
  const std::size_t colon = text.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const auto rank = whole_number<int>(text.substr(0, colon));
  const auto step = whole_number<std::uint64_t>(text.substr(colon + 1));
  if (!rank || !step) return std::nullopt;
  return std::pair{*rank, *step};
}

// RANK:STEP of --inject-fault and --inject-nan.
std::pair<int, std::uint64_t> parse_rank_step(const std::string& spec, const std::string& flag) {
  const auto at = rank_step(spec);
  if (!at) throw InputError(flag + ": expected RANK:STEP, got '" + spec + "'");
  return *at;
}

StallInjection parse_stall(const std::string& spec) {
  const std::size_t last = spec.rfind(':');
  const std::string_view text(spec);
  auto at = last == std::string::npos ? std::nullopt : rank_step(text.substr(0, last));
  const std::string_view phase = last == std::string::npos ? "" : text.substr(last + 1);
  StallInjection stall;
  if (phase == "data") {
    stall.phase = StallPhase::kData;
  } else if (phase == "compute") {
    stall.phase = StallPhase::kCompute;
  } else if (phase == "collective") {
    stall.phase = StallPhase::kCollective;
  } else {
    at.reset();
  }
  if (!at) throw InputError("--inject-stall: expected RANK:STEP:data|compute|collective, got '" + spec + "'");
  stall.rank = at->first;
  stall.step = at->second;
  return stall;
}

// The flag that gives each config value (InputError::input()).
const FlagNames kTrainFlags = {
    {"batch", "--batch-size"},      {"optimizer.lr", "--lr"},   {"optimizer.momentum", "--momentum"},
    {"optimizer.weight_decay", "--weight-decay"}, {"optimizer.nesterov", "--nesterov"},
    {"optimizer.betas", "--betas"}, {"optimizer.eps", "--eps"}, {"optimizer.rho", "--rho"},
    {"schedule.warmup", "--warmup"}, {"schedule.step_epochs", "--lr-step"}, {"schedule.gamma", "--gamma"},
    {"schedule", "--lr-schedule"},  {"target_accuracy", "--target-accuracy"}, {"eval_every", "--eval-every"},
    {"bucket_mb", "--bucket-mb"}, {"timeout_s", "--timeout"}, {"exchange", "--exchange"},
    {"keep", "--keep"},             {"save_every", "--save-every"}, {"save", "--save"},
    {"metrics", "--metrics"},       {"load", "--load"},         {"fault", "--inject-fault"},
    {"stall", "--inject-stall"},    {"nan", "--inject-nan"},    {"trace", "--trace"},
    {"trace_steps", "--trace-steps"},
};

// A run stopped by a signal: where its checkpoint is, and how to go on.
int interrupted(const Interruption& i) {
  std::cout << "mnist_mt: " << signal_name(i.signal) << ": stopped at epoch " << i.epoch + 1 << " step "
            << i.epoch_step << " (global step " << i.step << "); ";
  if (i.checkpoint.empty()) {
    std::cout << "no checkpoint saved (no --save, and no place to write one)" << std::endl;
  } else {
    const std::string file = one_line(i.checkpoint.string());
    std::cout << "checkpoint saved to " << file << "; add --load " << file << " to the same command to finish the run"
              << std::endl;
  }
  return 128 + i.signal;
}

// The files of the run by their flags, checked before it finds or downloads the data.
RunFiles run_files(const TrainFlags& f, const TrainConfig& config) {
  RunFiles files;
  if (config.save) files.outputs.push_back({*config.save, "--save", true});
  if (config.metrics) files.outputs.push_back({*config.metrics, "--metrics"});
  if (config.trace) files.outputs.push_back({*config.trace, "--trace"});
  if (config.save && config.keep > 1) files.numbered = *config.save;
  if (config.load) files.inputs.push_back({*config.load, "--load", true});
  add_data_files(f.data, files);
  return files;
}

// Without --save, where a stop request saves: the working directory, else the temp
// directory, whichever the rule allows now; empty, and the start line's note says why,
// when neither does. So that a stop never ends in an error that loses the run.
std::filesystem::path interrupt_checkpoint(const TrainConfig& config, const RunFiles& files, std::string& note) {
  std::error_code ec;
  const std::filesystem::path temp_dir = std::filesystem::temp_directory_path(ec);
  std::vector<std::filesystem::path> places{config.interrupt_save};
  if (!ec) places.push_back(temp_dir / ("mnist_mt-interrupted-" + std::to_string(::geteuid()) + ".safetensors"));
  std::string refused;
  for (const std::filesystem::path& place : places) {
    const std::optional<std::string> problem = checkpoint_problem(place, files);
    if (!problem) {
      if (!refused.empty()) note = "; SIGINT/SIGTERM saves to " + place.string() + " (" + refused + ")";
      return place;
    }
    refused += (refused.empty() ? "" : "; ") + *problem;
  }
  note = "; no checkpoint on SIGINT/SIGTERM without --save (" + refused + ")";
  return {};
}

// A checkpoint that has trained the epochs --epochs asks for.
std::string nothing_to_train(const std::filesystem::path& file, std::uint32_t done, std::uint32_t epochs) {
  const std::string finished = done == epochs ? std::to_string(done) + " of " + std::to_string(epochs) + " epochs"
                                              : std::to_string(done) + " epochs, more than --epochs " + std::to_string(epochs);
  return file.string() + " has finished " + finished + "; nothing to train (raise --epochs)";
}

// A checkpoint whose run had reached the accuracy --target-accuracy asks for: the line's
// start, up to "nothing to train".
std::string target_reached(const std::filesystem::path& file, const Checkpoint& start, double target) {
  char text[96];
  std::snprintf(text, sizeof text, " reached %.2f%% test accuracy at its step %llu, --target-accuracy %g: ",
                100 * *start.test_accuracy, static_cast<unsigned long long>(start.step), 100 * target);
  return file.string() + text;
}

// What a resumed run does otherwise than the checkpoint's run would have: the settings it
// changes (Checkpoint::settings; --warmup only while either warm-up lasts; the global
// batch from the checkpoint's layout) and the data set, on one line; a --seed it does not
// use, on another.
struct ResumeChanges {
  std::vector<std::string> lines;
  bool steps = false;  // the steps differ from its run's
};
ResumeChanges resume_changes(const std::filesystem::path& file, const Checkpoint& start, const TrainConfig& config,
                             std::uint64_t world, bool seed_given) {
  // "--lr 0.1 (its run: 0.01)"; a switch as "with --nesterov (its run: without --nesterov)".
  const auto on_off = [](const std::string& flag, const std::string& value) -> std::optional<std::string> {
    if (value == "true" || value == "false") return (value == "true" ? "with " : "without ") + flag;
    return std::nullopt;
  };
  std::string changed;
  const auto add = [&](const std::string& ours, const std::string& theirs) {
    changed += (changed.empty() ? "" : ", ") + ours + " (its run: " + theirs + ")";
  };
  for (const auto& [flag, value] : trajectory_settings(config)) {
    const auto theirs = std::find_if(start.settings.begin(), start.settings.end(),
                                     [&](const auto& setting) { return setting.first == flag; });
    if (theirs == start.settings.end() || theirs->second == value) continue;
    if (flag == "--warmup" && start.step >= std::max(config.schedule.warmup, whole_number<std::uint32_t>(theirs->second).value_or(0)))
      continue;
    add(on_off(flag, value).value_or(flag + " " + value), on_off(flag, theirs->second).value_or(theirs->second));
  }
  const std::uint64_t global = std::uint64_t{config.batch} * world;
  if (start.world != 0 && start.global_batch() != global)
    add("a global batch of " + std::to_string(global), std::to_string(start.global_batch()));
  if (!start.dataset.empty() && start.dataset != config.data_name) add("data set " + config.data_name, start.dataset);
  ResumeChanges out;
  out.steps = !changed.empty();
  if (out.steps)
    out.lines.push_back(one_line("mnist_mt: resuming " + file.string() + " with " + changed +
                                 ": its steps from here are not those its run would have taken"));
  if (seed_given && config.seed != start.seed)
    out.lines.push_back("mnist_mt: --seed " + std::to_string(config.seed) +
                        " is not used: a resumed run draws as its checkpoint's did, from seed " +
                        std::to_string(start.seed));
  return out;
}

// Where the CPU devices' threads run, for the line that starts a run.
std::string pinning(std::size_t devices) {
  const std::vector<int> cores = cpu_cores_for(devices);
  if (cores.empty()) {
    const std::size_t cpus = cpu_mask().size();
    return " (threads unpinned: " + std::to_string(devices) + (devices == 1 ? " rank" : " ranks") + " for " +
           std::to_string(cpus) + (cpus == 1 ? " CPU)" : " CPUs)");
  }
  std::string text = " on CPU";
  text += cores.size() == 1 ? " " : "s ";
  for (std::size_t i = 0; i < cores.size(); ++i) text += (i == 0 ? "" : ",") + std::to_string(cores[i]);
  return text;
}

}  // namespace


int run_train(const TrainFlags& f, StopRequest& stop, const std::shared_ptr<Processes>& processes) {
  TrainConfig config;
  config.stop = &stop;
  config.processes = processes;
  // World rank 0's process reports; the others say only what goes wrong (stderr).
  const bool reports = processes == nullptr || processes->index() == 0;
  std::ostream quiet(nullptr);
  std::ostream& out = reports ? std::cout : quiet;
  config.mode = f.mode == "dp" ? Mode::kDp : Mode::kDdp;
  if (f.target_accuracy) config.target_accuracy = *f.target_accuracy / 100.0;
  config.eval_every = count_flag(f.eval_every, 0, "--eval-every");
  if (f.seed) config.seed = *f.seed;
  config.bucket_mb = f.bucket_mb;
  config.exchange = f.exchange == "factors" ? Exchange::kFactors : f.exchange == "gradients" ? Exchange::kGradients
                                                                                           : Exchange::kAuto;
  config.max_steps = count_flag(f.max_steps, 0, "--max-steps");
  if (f.save) config.save = *f.save;
  if (f.load) config.load = *f.load;
  if (f.metrics) config.metrics = *f.metrics;
  if (f.trace) config.trace = *f.trace;
  config.trace_steps = count_flag(f.trace_steps, 1, "--trace-steps");
  config.phase_times = f.phase_times;
  config.on_nan = f.on_nan == "skip" ? NanPolicy::kSkip : NanPolicy::kStop;
  if (f.inject_fault) {
    const auto [rank, step] = parse_rank_step(*f.inject_fault, "--inject-fault");
    config.faults.fault = FaultInjection{rank, step};
  }
  if (f.inject_nan) {
    const auto [rank, step] = parse_rank_step(*f.inject_nan, "--inject-nan");
    config.faults.nan = NanInjection{rank, step};
  }
  if (f.inject_stall) config.faults.stall = parse_stall(*f.inject_stall);
  config.save_every = count_flag(f.save_every, 0, "--save-every");
  config.keep = count_flag(f.keep, 0, "--keep");
  config.timeout_s = f.timeout;
  config.progress = &out;

  // Several processes (processes is null for one): the launcher's binding applies.
  const bool pin = !f.device.no_pin && processes == nullptr;
  Devices devices = pick_devices(f.device, pin);
  if (processes != nullptr) take_host_share(devices, f.device, *processes, config.timeout_s);
  config.devices = devices.ids;
  const std::size_t world = devices.ids.size() * static_cast<std::size_t>(processes ? processes->count() : 1);
  apply_training_flags(f.training, world, config);
  // The values and the files are checked before the data is found or downloaded; by
  // world rank 0's process, the one that writes the files.
  with_flag_names(kTrainFlags, [&] { check_train_config(config); });
  check_host_memory(*devices.backend, config.batch, config.devices.size());
  std::string interrupt_note;
  if (reports) {
    const RunFiles files = run_files(f, config);
    check_run_files(files);
    // Several processes end at the first signal without a checkpoint.
    if (!config.save && processes == nullptr) config.interrupt_save = interrupt_checkpoint(config, files, interrupt_note);
  }
  std::optional<Checkpoint> start;  // train() reads it again
  bool reached = false;
  if (config.load && config.epochs > 0) {  // --epochs 0 says so below
    start = load_flag(*config.load);
    reached = config.target_accuracy && start->test_accuracy &&
              reaches_target(*start->test_accuracy, *config.target_accuracy);
    if (start->epoch >= config.epochs) {
      out << "mnist_mt: " << one_line(nothing_to_train(*config.load, start->epoch, config.epochs))
          << (reached ? " (its recorded test accuracy reaches --target-accuracy too)" : "") << std::endl;
      if (reports) finish_stdout();
      return 0;
    }
  }
  const Dataset data = load_data(f.data, out, &stop, &config.data_name);
  if (start) {
    ResumeChanges changes = resume_changes(*config.load, *start, config, world, f.seed.has_value());
    config.resume_notes = std::move(changes.lines);
    config.resume_changes_steps = changes.steps;
    // Another data set's accuracy is not this one's; and several processes would decide
    // on their own data before they meet (one might end while the others wait).
    if (start->dataset != config.data_name || processes != nullptr) reached = false;
  }
  // No epochs, or a checkpoint whose run reached the target asked for (told once the data
  // is found and read): that is all.
  const bool writes = config.save || config.metrics || config.trace;
  if (config.epochs == 0 || reached) {
    out << "mnist_mt: "
        << (reached ? one_line(target_reached(*config.load, *start, *config.target_accuracy)) : "--epochs 0: ")
        << "nothing to train" << (writes ? ", nothing written" : "") << (reached ? " (raise --target-accuracy)" : "")
        << std::endl;
    if (reports) finish_stdout();
    return 0;
  }
  // A signal until now ends the run here: nothing is trained, nothing to save.
  if (!stop.start_training(config.save || !config.interrupt_save.empty()))
    throw Interrupted(std::string(signal_name(stop.stop_signal())) + ": stopped before training started",
                      stop.stop_signal());
  out << "mnist_mt: " << (config.mode == Mode::kDp ? "dp" : "ddp") << " on ";
  if (processes != nullptr) out << processes->count() << " processes x ";
  out << config.devices.size() << ' ' << devices.backend->name() << " device(s)";
  if (pin && devices.backend->name() == "cpu") out << pinning(config.devices.size());
  if (devices.backend->precision() == Precision::kBf16) out << ", fc1 and fc2 on bf16 operands";
  out << ", batch " << config.batch << " per device, " << describe_training(config) << ", " << data.train.size()
      << " training and " << data.test.size() << " test images"
      << one_line(interrupt_note) << std::endl;
  const TrainResult result = with_flag_names(kTrainFlags, [&] { return train(*devices.backend, data, config); });
  // A target asked for and not reached by the end says so (a reached one has its line).
  if (config.target_accuracy && !result.interrupted && !result.epochs.empty() &&
      !result.epochs.back().time_to_target_s && std::isfinite(result.epochs.back().test_accuracy)) {
    char text[128];
    std::snprintf(text, sizeof text, "mnist_mt: --target-accuracy %g not reached: test accuracy %.2f%% at the end",
                  100 * *config.target_accuracy, 100 * result.epochs.back().test_accuracy);
    out << text << std::endl;
  }
  if (processes != nullptr) {
    // MPI_Finalize waits for every process, with no limit: the processes meet first,
    // within --timeout, so that one that stopped at the end is reported, not waited for.
    const char mine = 0;
    std::vector<char> all(static_cast<std::size_t>(processes->count()));
    allgather_within(*processes, &mine, all.data(), 1, config.timeout_s, "at the end of the run");
  }
  // Its files are written by now: a write error on stdout (a full disk, a closed
  // descriptor) fails the run as eval's does; a reader that went away is only noted.
  if (reports) finish_stdout();
  return result.interrupted ? interrupted(*result.interrupted) : 0;
}

}  // namespace mnist_mt::cli
