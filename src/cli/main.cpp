// mnist_mt: flags -> TrainConfig -> train(). Exit codes: 0 done, 2 bad input or usage,
// 3 a failure while running. Every error is one line on stderr.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/trainer.hpp"
#include "signal_watch.hpp"

namespace mnist_mt {
namespace {

struct Flags {
  std::optional<std::int64_t> cpu;
  std::optional<std::string> gpus;
  std::string mode = "ddp";
  std::int64_t epochs = 1;
  std::int64_t batch = 64;
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
  std::uint64_t seed = 1;
  double bucket_mb = 25.0;
  std::string data = kDefaultDataDir.string();
  std::optional<std::string> save;
  std::int64_t save_every = 0;
  std::int64_t keep = 1;
  double timeout = 600;
  std::optional<std::string> load;
  std::optional<std::string> metrics;
  bool deterministic = false;
  bool tf32 = false;
  std::int64_t max_steps = 0;
  std::optional<std::string> inject_fault;
  std::optional<std::string> inject_stall;
};

void add_flags(CLI::App& app, Flags& f) {
  auto* cpu = app.add_option("--cpu", f.cpu, "Train on N CPU devices (threads), one rank each");
  app.add_option("--gpus", f.gpus, "Train on these CUDA devices, e.g. 0,1,2")->excludes(cpu);
  app.add_option("--mode", f.mode, "ddp, or dp for the DataParallel-style baseline")
      ->check(CLI::IsMember({"ddp", "dp"}))
      ->capture_default_str();
  app.add_option("--epochs", f.epochs, "Epochs the run trains in all (with --load: up to this many)")
      ->capture_default_str();
  app.add_option("--batch-size", f.batch, "Batch size per device")->capture_default_str();
  app.add_option("--lr", f.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "SGD weight decay")->capture_default_str();
  app.add_option("--seed", f.seed, "Seed of the initial weights, the data order and dropout")->capture_default_str();
  app.add_option("--bucket-mb", f.bucket_mb, "Gradient bucket cap in MiB (the first bucket: at most 1 MiB)")
      ->capture_default_str();
  app.add_option("--data", f.data, "Directory of the MNIST-format IDX files")->capture_default_str();
  app.add_option("--save", f.save, "Write a safetensors checkpoint there after each epoch and on SIGINT/SIGTERM");
  app.add_option("--save-every", f.save_every, "Also save every this many steps (0: at epoch ends only)")
      ->capture_default_str();
  app.add_option("--keep", f.keep, "Keep the last N checkpoints (N > 1: one file per step, --save links the latest)")
      ->capture_default_str();
  app.add_option("--timeout", f.timeout, "Fail the run when a rank makes no progress for this many seconds (0: off)")
      ->capture_default_str();
  app.add_option("--load", f.load, "Start from this checkpoint (weights, momentum, epoch, step, seed)");
  app.add_option("--metrics", f.metrics, "Write one JSON line per epoch to this file");
  app.add_flag("--deterministic", f.deterministic, "CUDA: deterministic algorithms only");
  app.add_flag("--tf32", f.tf32, "CUDA: allow TF32 math");
  app.add_option("--max-steps", f.max_steps, "Stop each epoch after this many steps (0: the whole epoch)")
      ->capture_default_str();
  // Tests only, kept out of --help: rank RANK throws at global step STEP.
  app.add_option("--inject-fault", f.inject_fault)->group("");
  // Tests only: rank RANK stops making progress in PHASE (data, compute, collective) of step STEP.
  app.add_option("--inject-stall", f.inject_stall)->group("");
}

// A count from min up to what 32 bits hold.
std::uint32_t count_flag(std::int64_t value, std::int64_t min, const std::string& flag) {
  constexpr std::int64_t kMax = std::numeric_limits<std::uint32_t>::max();
  if (value < min || value > kMax) {
    throw InputError(flag + ": must be from " + std::to_string(min) + " to " + std::to_string(kMax) + ", got " +
                     std::to_string(value));
  }
  return static_cast<std::uint32_t>(value);
}

std::string show(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

float non_negative(double value, const std::string& flag) {
  if (!std::isfinite(value) || value < 0) throw InputError(flag + ": must be a finite number >= 0, got " + show(value));
  return static_cast<float>(value);
}

// The whole of `text` as a number, or nothing.
template <typename T>
std::optional<T> number(std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// "0,2,3": distinct non-negative device numbers.
std::vector<int> parse_gpus(const std::string& list) {
  if (list.empty()) throw InputError("--gpus: empty device list");
  std::vector<int> ids;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    const std::string item = list.substr(begin, end - begin);
    const auto id = number<int>(item);
    if (!id) throw InputError("--gpus: '" + item + "' is not a device number");
    if (*id < 0) throw InputError("--gpus: device " + item + " is negative");
    if (std::find(ids.begin(), ids.end(), *id) != ids.end()) {
      throw InputError("--gpus: device " + item + " is listed twice");
    }
    ids.push_back(*id);
    begin = end + 1;
  }
  return ids;
}

FaultInjection parse_fault(const std::string& spec) {
  const std::size_t colon = spec.find(':');
  const auto rank = number<int>(std::string_view(spec).substr(0, colon));
  const auto step =
      colon == std::string::npos ? std::nullopt : number<std::uint64_t>(std::string_view(spec).substr(colon + 1));
  if (!rank || !step) throw InputError("--inject-fault: expected RANK:STEP, got '" + spec + "'");
  return {*rank, *step};
}

StallInjection parse_stall(const std::string& spec) {
  const std::size_t first = spec.find(':');
  const std::size_t second = first == std::string::npos ? first : spec.find(':', first + 1);
  const std::string_view text(spec);
  const auto rank = number<int>(text.substr(0, first));
  const auto step =
      second == std::string::npos ? std::nullopt : number<std::uint64_t>(text.substr(first + 1, second - first - 1));
  const std::string_view phase = second == std::string::npos ? "" : text.substr(second + 1);
  StallInjection stall;
  if (phase == "data") {
    stall.phase = StallPhase::kData;
  } else if (phase == "compute") {
    stall.phase = StallPhase::kCompute;
  } else if (phase == "collective") {
    stall.phase = StallPhase::kCollective;
  } else {
    throw InputError("--inject-stall: expected RANK:STEP:data|compute|collective, got '" + spec + "'");
  }
  if (!rank || !step) throw InputError("--inject-stall: expected RANK:STEP:data|compute|collective, got '" + spec + "'");
  stall.rank = *rank;
  stall.step = *step;
  return stall;
}

// No device flag: every GPU when the CUDA backend is built and sees any, else a CPU
// rank per core.
std::unique_ptr<Backend> default_backend(const BackendOptions& options, std::vector<int>& ids) {
  if (cuda_built()) {
    try {
      auto cuda = make_cuda_backend(options);
      if (cuda->device_count() > 0) {
        for (int i = 0; i < cuda->device_count(); ++i) ids.push_back(i);
        return cuda;
      }
    } catch (const std::exception&) {  // no driver or no device: train on the CPU
    }
  }
  auto cpu = make_cpu_backend(options);
  for (int i = 0; i < cpu->device_count(); ++i) ids.push_back(i);
  return cpu;
}

// A run stopped by a signal: where its checkpoint is, and how to go on.
int interrupted(const Interruption& i) {
  std::cout << "mnist_mt: " << signal_name(i.signal) << ": stopped at epoch " << i.epoch + 1 << " step "
            << i.epoch_step << " (global step " << i.step << "); checkpoint saved to " << i.checkpoint.string()
            << "; add --load " << i.checkpoint.string() << " to the same command to finish the run" << std::endl;
  return 128 + i.signal;
}

int run(const Flags& f, StopRequest& stop) {
  TrainConfig config;
  config.stop = &stop;
  config.mode = f.mode == "dp" ? Mode::kDp : Mode::kDdp;
  config.epochs = count_flag(f.epochs, 0, "--epochs");
  config.batch = count_flag(f.batch, 1, "--batch-size");
  config.sgd.lr = non_negative(f.lr, "--lr");
  config.sgd.momentum = non_negative(f.momentum, "--momentum");
  config.sgd.weight_decay = non_negative(f.weight_decay, "--weight-decay");
  config.seed = f.seed;
  config.bucket_mb = f.bucket_mb;
  if (!(f.bucket_mb > 0) || !std::isfinite(f.bucket_mb)) {
    throw InputError("--bucket-mb: must be a positive number, got " + show(f.bucket_mb));
  }
  config.max_steps = count_flag(f.max_steps, 0, "--max-steps");
  if (f.save) config.save = *f.save;
  if (f.load) config.load = *f.load;
  if (f.metrics) config.metrics = *f.metrics;
  if (f.inject_fault) config.fault = parse_fault(*f.inject_fault);
  if (f.inject_stall) config.stall = parse_stall(*f.inject_stall);
  config.save_every = count_flag(f.save_every, 0, "--save-every");
  config.keep = count_flag(f.keep, 1, "--keep");
  if (f.keep > 1 && !f.save) throw InputError("--keep: needs --save");
  if (f.save_every > 0 && !f.save) throw InputError("--save-every: needs --save");
  if (!std::isfinite(f.timeout) || f.timeout < 0) {
    throw InputError("--timeout: must be a finite number of seconds >= 0, got " + show(f.timeout));
  }
  config.timeout_s = f.timeout;
  config.progress = &std::cout;

  BackendOptions options;
  options.deterministic = f.deterministic;
  options.tf32 = f.tf32;
  std::unique_ptr<Backend> backend;
  if (f.gpus) {
    config.devices = parse_gpus(*f.gpus);
    backend = make_cuda_backend(options);
    for (int id : config.devices) {
      if (id >= backend->device_count()) {
        throw InputError("--gpus: no device " + std::to_string(id) + " (this machine has " +
                         std::to_string(backend->device_count()) + " CUDA devices)");
      }
    }
  } else if (f.cpu) {
    const std::uint32_t count = count_flag(*f.cpu, 1, "--cpu");
    backend = make_cpu_backend(options);
    for (std::uint32_t i = 0; i < count; ++i) config.devices.push_back(static_cast<int>(i));
  } else {
    backend = default_backend(options, config.devices);
  }

  const Dataset data = load_dataset(f.data);
  std::cout << "mnist_mt: " << (config.mode == Mode::kDp ? "dp" : "ddp") << " on " << config.devices.size() << ' '
            << backend->name() << " device(s), batch " << config.batch << " per device, " << data.train.size()
            << " training and " << data.test.size() << " test images" << std::endl;
  const TrainResult result = train(*backend, data, config);
  return result.interrupted ? interrupted(*result.interrupted) : 0;
}

}  // namespace
}  // namespace mnist_mt

int main(int argc, char** argv) {
  mnist_mt::StopRequest stop;
  const mnist_mt::SignalWatch signals(stop);  // before any other thread starts
  CLI::App app("mnist_mt: data-parallel training of the MNIST CNN, a thread per device", "mnist_mt");
  mnist_mt::Flags flags;
  mnist_mt::add_flags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "mnist_mt: error: " << e.what() << std::endl;
    return 2;
  }
  try {
    return mnist_mt::run(flags, stop);
  } catch (const mnist_mt::Interrupted& e) {
    std::cerr << "mnist_mt: error: " << e.what() << std::endl;
    return 128 + e.signal();
  } catch (const mnist_mt::InputError& e) {
    std::cerr << "mnist_mt: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "mnist_mt: error: " << e.what() << std::endl;
    return 3;
  } catch (...) {
    std::cerr << "mnist_mt: error: unknown failure" << std::endl;
    return 3;
  }
}
