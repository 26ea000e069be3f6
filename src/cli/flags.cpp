// Every subcommand's flags as CLI11 options: the one file besides main.cpp that
// includes CLI11, whose header compiles slowly. What the flags mean and what is done
// with their values is in options.cpp and each command's file.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "commands.hpp"

namespace mnist_mt::cli {
namespace {

// What is wrong with a finite value >= 0, `text`, held as a T: too large, or so small
// that it becomes 0. Empty when nothing.
template <typename T>
std::string beyond(long double value, const std::string& text, const std::string& type) {
  const auto shown = [](long double bound) {
    char digits[32];
    std::snprintf(digits, sizeof digits, "%Lg", bound);
    return std::string(digits);
  };
  if (value > std::numeric_limits<T>::max())
    return text + " is more than " + type + " holds (" + shown(std::numeric_limits<T>::max()) + ")";
  if (value != 0 && static_cast<T>(value) == 0)
    return text + " is closer to 0 than " + type + " holds (its least above 0: " +
           shown(std::numeric_limits<T>::denorm_min()) + ")";
  return "";
}

// Checks of a number flag's value as typed, run by CLI11 before its own conversion
// (which reads "010" as octal, wraps "-1" into an unsigned, and turns a value past
// what the type holds into the largest or infinity); an error, "FLAG: problem", quotes
// the value as given.
// A whole decimal number from 0 to 2^64 - 1; it rewrites the value for CLI11 ("010"
// to "10"), so it is added with ->transform.
CLI::Validator unsigned_number() {
  return CLI::Validator([](std::string& text) -> std::string {
    const auto value = whole_number<std::uint64_t>(text);
    if (!value) {
      return "must be a whole number from 0 to " + std::to_string(std::numeric_limits<std::uint64_t>::max()) +
             ", got " + (text.empty() ? "''" : text);
    }
    text = std::to_string(*value);  // as CLI11 reads it: "010" is 10
    return "";
  }, "");
}

// A whole decimal number that 64 bits hold (the flag's own range, up to what 32 bits hold,
// is count_flag's); quoting the value as typed when it is not one, or past 2^63 (which
// CLI11 would turn into the largest); it rewrites the value for CLI11 ("010" to "10"),
// so it is added with ->transform.
CLI::Validator count_number(std::int64_t min) {
  return CLI::Validator([min](std::string& text) -> std::string {
    if (const auto value = whole_number<std::int64_t>(text)) {
      text = std::to_string(*value);
      return "";
    }
    const std::string_view digits = std::string_view(text).substr(text.starts_with('-') ? 1 : 0);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos)
      return "'" + text + "' is not a whole number";
    return "must be from " + std::to_string(min) + " to " + std::to_string(std::numeric_limits<std::uint32_t>::max()) +
           ", got " + text;
  }, "");
}

// A finite number >= 0 (`positive`: > 0) that a double holds, or a float when the
// value is narrowed to one; a nonzero value that would become 0 is refused too.
CLI::Validator real_number(bool positive, bool narrowed_to_float = false) {
  return CLI::Validator([positive, narrowed_to_float](std::string& text) -> std::string {
    char* end = nullptr;
    const long double value = std::strtold(text.c_str(), &end);  // as CLI11 reads it
    if (text.empty() || end != text.c_str() + text.size() || std::isnan(value)) return "'" + text + "' is not a number";
    // strtold reads hexadecimal too ("0x10" is 16): numbers are decimal, as --seed's.
    if (text.find_first_of("xX") != std::string::npos) return "'" + text + "' is not a decimal number";
    if (value < 0 || (positive && value == 0)) return std::string("must be ") + (positive ? "> 0" : ">= 0") + ", got " + text;
    if (std::isinf(value)) return "must be a finite number, got " + text;
    return narrowed_to_float ? beyond<float>(value, text, "a float") : beyond<double>(value, text, "a double");
  }, "");
}

}  // namespace

void add_device_flags(CLI::App& app, DeviceFlags& f) {
  auto* cpu = app.add_option("--cpu", f.cpu, "Run on N CPU devices (threads), one rank each");
  app.add_option("--gpus", f.gpus, "Run on these CUDA devices, e.g. 0,1,2")->excludes(cpu);
  app.add_flag("--deterministic", f.deterministic, "CUDA: deterministic algorithms only");
  app.add_flag("--tf32", f.tf32, "GPUs: allow TF32 math (as --precision tf32)");
  app.add_option("--precision", f.precision,
                 "fp32; tf32: cuDNN and cuBLAS may use TF32 tensor cores (GPUs); or bf16: fc1's and fc2's products on "
                 "bfloat16 operands (CPU devices with AVX512_BF16 or AMX)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}))
      ->capture_default_str();
}

void add_data_flags(CLI::App& app, DataFlags& f) {
  app.add_option("--data", f.data,
                 "Directory of the IDX files (or of torchvision's MNIST/raw); with --download, where they go");
  app.add_option("--dataset", f.dataset,
                 "The data set wanted (not given: MNIST, or Debian's Fashion-MNIST when no MNIST is found; given: that "
                 "one only)")
      ->check(CLI::IsMember({"mnist", "fashion-mnist"}))
      ->default_str("mnist");
  app.add_flag("--download", f.download, "Fetch the data set's files (verified) unless present");
  app.add_option("--mirror", f.mirrors, "With --download: a base URL tried before the published mirrors (repeatable)")
      ->allow_extra_args(false);
}

void add_train_flags(CLI::App& app, TrainFlags& f) {
  add_device_flags(app, f.device);
  app.add_flag("--no-cuda-graphs", f.device.no_cuda_graphs,
               "CUDA: enqueue each step's work instead of replaying it as a CUDA graph");
  app.add_flag("--no-device-data", f.device.no_device_data,
               "CUDA: copy each batch's images from the host instead of holding the data set in device memory");
  app.add_flag("--no-pin", f.device.no_pin,
               "CPU: leave each rank's threads unpinned (by default, in one process, they run on a CPU of their own when the ranks are as many as the CPUs the process may use)");
  app.add_option("--mode", f.mode, "ddp, or dp for torch.nn.DataParallel's step: one host thread, device 0 holds the batch, the loss and the update")
      ->check(CLI::IsMember({"ddp", "dp"}))
      ->capture_default_str();
  TrainingFlags& t = f.training;
  app.add_option("--recipe", t.recipe,
                 "Train as a named recipe: pytorch-example, template or fast (docs/cli.md); the flags below override its values");
  app.add_option("--epochs", t.epochs, "Epochs the run trains in all (with --load: up to this many); default 1")
      ->transform(count_number(0));
  app.add_option("--batch-size", t.batch, "Batch size per device; default 64")
      ->transform(count_number(1));
  app.add_option("--optimizer", t.optimizer, "sgd, adam, adamw or adadelta, as torch.optim defines them; default sgd");
  app.add_option("--lr", t.lr, "Learning rate (OneCycle's maximum); default 0.01 for sgd, else torch.optim's")
      ->check(real_number(false, true));
  app.add_option("--momentum", t.momentum, "SGD momentum; default 0")->check(real_number(false, true));
  app.add_flag("--nesterov", t.nesterov, "SGD: Nesterov momentum");
  app.add_option("--weight-decay", t.weight_decay, "Weight decay (adamw: decoupled); default 0, adamw 0.01")
      ->check(real_number(false, true));
  app.add_option("--betas", t.betas, "Adam/AdamW: B1,B2; default 0.9,0.999");
  app.add_option("--eps", t.eps, "Adam/AdamW/Adadelta epsilon; default 1e-8, adadelta 1e-6")
      ->check(real_number(false, true));
  app.add_option("--rho", t.rho, "Adadelta rho; default 0.9")->check(real_number(false, true));
  app.add_option("--lr-schedule", t.lr_schedule,
                 "constant, step (StepLR, per epoch), onecycle (OneCycleLR, per step) or cosine (CosineAnnealingLR over the run's steps); default constant");
  app.add_option("--lr-step", t.lr_step, "step: epochs between rate changes (StepLR's step_size); default 1")
      ->transform(count_number(1));
  app.add_option("--gamma", t.gamma, "step: the rate's factor at each change; default 0.1")->check(real_number(true));
  app.add_option("--warmup", t.warmup, "Steps of linear warm-up before the schedule (not with onecycle); default 0")
      ->transform(count_number(0));
  app.add_option("--target-accuracy", f.target_accuracy,
                 "Stop once the test accuracy reaches this many percent (evaluated at epoch ends and every --eval-every steps)");
  app.add_option("--eval-every", f.eval_every, "With --target-accuracy: also evaluate every this many steps (0: epoch ends only)")
      ->transform(count_number(0))
      ->capture_default_str();
  app.add_option("--seed", f.seed, "Seed of the initial weights, the data order and dropout")
      ->transform(unsigned_number())
      ->default_str(std::to_string(TrainConfig{}.seed));
  app.add_option("--bucket-mb", f.bucket_mb, "Gradient bucket cap in MiB (the first bucket: at most 1 MiB)")
      ->check(real_number(true))
      ->capture_default_str();
  app.add_option("--exchange", f.exchange,
                 "How the ranks combine fc1's weight gradient: gradients (an allreduce), factors (an allgather of each "
                 "rank's B x 9344 factors; CPU devices, --mode ddp) or auto (factors at world batches up to 64 "
                 "across processes, up to 8 in one)")
      ->check(CLI::IsMember({"auto", "gradients", "factors"}))
      ->capture_default_str();
  add_data_flags(app, f.data);
  app.add_option("--save", f.save, "Write a safetensors checkpoint there after each epoch and on SIGINT/SIGTERM");
  app.add_option("--save-every", f.save_every, "Also save every this many steps (0: at epoch ends only)")
      ->transform(count_number(0))
      ->capture_default_str();
  app.add_option("--keep", f.keep, "Keep the last N checkpoints (N > 1: one file per step, --save links the latest)")
      ->transform(count_number(1))
      ->capture_default_str();
  app.add_option("--timeout", f.timeout, "Fail the run when a rank makes no progress for this many seconds (0: off)")
      ->check(real_number(false))
      ->capture_default_str();
  app.add_option("--on-nan", f.on_nan,
                 "A step with a non-finite loss or gradient norm: stop (exit 3), or skip its update on every rank")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  app.add_option("--load", f.load, "Start from this checkpoint (weights, optimizer state, epoch, step, seed; the settings and data set it records are compared)");
  app.add_option("--metrics", f.metrics, "Write one JSON line per epoch to this file");
  app.add_option("--trace", f.trace,
                 "Write a Chrome trace-event JSON (chrome://tracing, Perfetto) of the first steps to this file (ddp)");
  app.add_option("--trace-steps", f.trace_steps, "Steps that --trace records")
      ->transform(count_number(1))->capture_default_str();
  app.add_flag("--phase-times", f.phase_times,
               "ddp: time every step's phases on the device (forward, backward, comm wait, optimizer in --metrics); on "
               "GPUs this puts timing events inside each replayed CUDA graph. Without it (nor --trace) a replayed step "
               "is timed whole. CPU devices and --mode dp time every phase either way");
  app.add_option("--max-steps", f.max_steps, "Stop each epoch after this many steps (0: the whole epoch)")
      ->transform(count_number(0))
      ->capture_default_str();
  // Tests only, kept out of --help: rank RANK throws at global step STEP.
  app.add_option("--inject-fault", f.inject_fault)->group("");
  // Tests only: rank RANK stops making progress in PHASE (data, compute, collective) of step STEP.
  app.add_option("--inject-stall", f.inject_stall)->group("");
  // Tests only: rank RANK's loss and gradients are NaN at global step STEP.
  app.add_option("--inject-nan", f.inject_nan)->group("");
}

void add_eval_flags(CLI::App& app, EvalFlags& f) {
  add_device_flags(app, f.device);
  add_data_flags(app, f.data);
  app.add_option("--load", f.load, "The checkpoint to evaluate")->required();
  app.add_option("--batch-size", f.batch, "Batch size per device")
      ->transform(count_number(1))->capture_default_str();
  app.add_option("--json", f.json, "Also write the results to this file as JSON");
}

void add_predict_flags(CLI::App& app, PredictFlags& f) {
  add_device_flags(app, f.device);
  add_data_flags(app, f.data);
  app.add_option("--load", f.load, "The checkpoint whose weights predict")->required();
  app.add_option("--index", f.indices, "Also predict test image N of the data set (repeatable)")
      ->transform(count_number(0))->allow_extra_args(false);
  app.add_option("images", f.images, "PNG or binary PGM images: 28x28 grey, else converted and resized");
}

}  // namespace mnist_mt::cli
