#include <charconv>
#include <cmath>
#include <iostream>
#include <string_view>

#include "commands.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/trainer.hpp"

namespace mnist_mt::cli {
namespace {

FaultInjection parse_fault(const std::string& spec) {
  const std::size_t colon = spec.find(':');
  int rank = 0;
  std::uint64_t step = 0;
  const auto whole = [](std::string_view text, auto& value) {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    return !text.empty() && ec == std::errc() && end == text.data() + text.size();
  };
  if (colon == std::string::npos || !whole(std::string_view(spec).substr(0, colon), rank) ||
      !whole(std::string_view(spec).substr(colon + 1), step)) {
    throw InputError("--inject-fault: expected RANK:STEP, got '" + spec + "'");
  }
  return {rank, step};
}

}  // namespace

void add_train_flags(CLI::App& app, TrainFlags& f) {
  add_device_flags(app, f.device);
  app.add_option("--mode", f.mode, "ddp, or dp for the DataParallel-style baseline")
      ->check(CLI::IsMember({"ddp", "dp"}))
      ->capture_default_str();
  app.add_option("--epochs", f.epochs, "Epochs to train")->capture_default_str();
  app.add_option("--batch-size", f.batch, "Batch size per device")->capture_default_str();
  app.add_option("--lr", f.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "SGD weight decay")->capture_default_str();
  app.add_option("--seed", f.seed, "Seed of the initial weights, the data order and dropout")->capture_default_str();
  app.add_option("--bucket-mb", f.bucket_mb, "Gradient bucket cap in MiB (the first bucket: at most 1 MiB)")
      ->capture_default_str();
  add_data_flags(app, f.data);
  app.add_option("--save", f.save, "Write a safetensors checkpoint there after each epoch");
  app.add_option("--load", f.load, "Start from this checkpoint (weights, momentum, epoch, step, seed)");
  app.add_option("--metrics", f.metrics, "Write one JSON line per epoch to this file");
  app.add_option("--max-steps", f.max_steps, "Stop each epoch after this many steps (0: the whole epoch)")
      ->capture_default_str();
  // Tests only, kept out of --help: rank RANK throws at global step STEP.
  app.add_option("--inject-fault", f.inject_fault)->group("");
}

int run_train(const TrainFlags& f) {
  TrainConfig config;
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
  config.progress = &std::cout;

  Devices devices = pick_devices(f.device);
  config.devices = devices.ids;
  const Dataset data = load_data(f.data, std::cout);
  std::cout << "mnist_mt: " << (config.mode == Mode::kDp ? "dp" : "ddp") << " on " << config.devices.size() << ' '
            << devices.backend->name() << " device(s), batch " << config.batch << " per device, " << data.train.size()
            << " training and " << data.test.size() << " test images" << std::endl;
  train(*devices.backend, data, config);
  return 0;
}

}  // namespace mnist_mt::cli
