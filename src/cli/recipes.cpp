#include "recipes.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "mnist_mt/error.hpp"
#include "options.hpp"

namespace mnist_mt::cli {
namespace {

// What a run trains with when no recipe is named: the flags' documented defaults.
constexpr Recipe kDefault{"default", "mnist_mt's defaults", OptimizerKind::kSgd, 0.01, 0.0, false, 0.0,
                          ScheduleKind::kConstant, 1, 0.1, 0, 1, 64, false};

// torch.optim's defaults for the optimizer (SGD's lr, which PyTorch requires, is ours).
OptimizerOptions torch_defaults(OptimizerKind kind) {
  OptimizerOptions o;
  o.kind = kind;
  switch (kind) {
    case OptimizerKind::kSgd: o.lr = kDefault.lr; break;
    case OptimizerKind::kAdam: o.lr = 1e-3; break;
    case OptimizerKind::kAdamW:
      o.lr = 1e-3;
      o.weight_decay = 1e-2;
      break;
    case OptimizerKind::kAdadelta:
      o.lr = 1.0;
      o.eps = 1e-6;
      break;
  }
  return o;
}

// "B1,B2" as two numbers.
std::pair<double, double> parse_betas(const std::string& text) {
  const std::size_t comma = text.find(',');
  const auto number = [&](std::string_view part) -> std::optional<double> {
    double value = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size()) return std::nullopt;
    return value;
  };
  const std::string_view all(text);
  const auto b1 = comma == std::string::npos ? std::nullopt : number(all.substr(0, comma));
  const auto b2 = comma == std::string::npos ? std::nullopt : number(all.substr(comma + 1));
  if (!b1 || !b2) throw InputError("--betas: expected two numbers as B1,B2 (e.g. 0.9,0.999), got '" + text + "'");
  return {*b1, *b2};
}

const Recipe& find_recipe(const std::optional<std::string>& name) {
  if (!name) return kDefault;
  const auto& all = recipes();
  const auto it = std::find_if(all.begin(), all.end(), [&](const Recipe& r) { return r.name == *name; });
  if (it == all.end()) {
    std::string names;
    for (const Recipe& r : all) names += (names.empty() ? "" : ", ") + std::string(r.name);
    throw InputError("--recipe: no recipe '" + *name + "' (there are " + names + ")");
  }
  return *it;
}

}  // namespace

const std::vector<Recipe>& recipes() {
  static const std::vector<Recipe> all{
      {"pytorch-example",
       "PyTorch's examples/mnist/main.py: Adadelta lr 1.0, StepLR(step_size=1, gamma=0.7), batch 64, 14 epochs",
       OptimizerKind::kAdadelta, 1.0, 0.0, false, 0.0, ScheduleKind::kStep, 1, 0.7, 0, 14, 64, true},
      {"template", "the DDP template this project replaces: SGD lr 1e-3, batch 4 per process, 1 epoch",
       OptimizerKind::kSgd, 1e-3, 0.0, false, 0.0, ScheduleKind::kConstant, 1, 0.1, 0, 1, 4, false},
      {"fast",
       "the least training found to reach 99.0% test accuracy on every seed for this network "
       "(docs/benchmarks.md): AdamW lr 3e-3, one-cycle, global batch 128, 3 epochs",
       OptimizerKind::kAdamW, 3e-3, 0.0, false, 1e-2, ScheduleKind::kOneCycle, 1, 0.1, 0, 3, 128, true},
  };
  return all;
}

void apply_training_flags(const TrainingFlags& f, std::size_t world, TrainConfig& config) {
  const Recipe& recipe = find_recipe(f.recipe);
  OptimizerKind kind = recipe.optimizer;
  if (f.optimizer) {
    const std::optional<OptimizerKind> named = parse_optimizer(*f.optimizer);
    if (!named) throw InputError("--optimizer: no optimizer '" + *f.optimizer + "' (sgd, adam, adamw, adadelta)");
    kind = *named;
  }
  // The recipe's rates are for its optimizer; another takes torch.optim's defaults.
  OptimizerOptions o = torch_defaults(kind);
  if (kind == recipe.optimizer) {
    o.lr = recipe.lr;
    o.momentum = recipe.momentum;
    o.nesterov = recipe.nesterov;
    o.weight_decay = recipe.weight_decay;
  }
  if (f.lr) o.lr = *f.lr;
  if (f.momentum) o.momentum = *f.momentum;
  if (f.nesterov) o.nesterov = true;
  if (f.weight_decay) o.weight_decay = *f.weight_decay;
  if (f.betas) std::tie(o.beta1, o.beta2) = parse_betas(*f.betas);
  if (f.eps) o.eps = *f.eps;
  if (f.rho) o.rho = *f.rho;
  // Another optimizer's flags would do nothing: refused, as --momentum is with Adam.
  const std::string name(optimizer_name(kind));
  if (f.betas && kind != OptimizerKind::kAdam && kind != OptimizerKind::kAdamW)
    throw InputError("--betas: Adam's and AdamW's; the " + name + " optimizer has none (--optimizer)");
  if (f.eps && kind == OptimizerKind::kSgd)
    throw InputError("--eps: Adam's, AdamW's and Adadelta's; the sgd optimizer has none (--optimizer)");
  if (f.rho && kind != OptimizerKind::kAdadelta)
    throw InputError("--rho: Adadelta's; the " + name + " optimizer has none (--optimizer)");
  config.optimizer = o;

  ScheduleOptions s;
  s.kind = recipe.schedule;
  s.step_epochs = recipe.lr_step;
  s.gamma = recipe.gamma;
  s.warmup = recipe.warmup;
  if (f.lr_schedule) {
    const std::optional<ScheduleKind> named = parse_schedule(*f.lr_schedule);
    if (!named)
      throw InputError("--lr-schedule: no schedule '" + *f.lr_schedule + "' (constant, step, onecycle, cosine)");
    s.kind = *named;
  }
  if (f.lr_step) s.step_epochs = count_flag(*f.lr_step, 1, "--lr-step");
  if (f.gamma) s.gamma = *f.gamma;
  if (f.warmup) s.warmup = count_flag(*f.warmup, 0, "--warmup");
  config.schedule = s;

  config.epochs = f.epochs ? count_flag(*f.epochs, 0, "--epochs") : recipe.epochs;
  if (f.batch) {
    config.batch = count_flag(*f.batch, 1, "--batch-size");
  } else if (recipe.global_batch) {
    if (world == 0 || recipe.batch % world != 0)
      throw InputError("--recipe " + std::string(recipe.name) + ": its global batch of " +
                       std::to_string(recipe.batch) + " images does not split evenly over " + std::to_string(world) +
                       " ranks; give --batch-size (per rank)");
    config.batch = static_cast<std::uint32_t>(recipe.batch / world);
  } else {
    config.batch = recipe.batch;
  }
}

std::string describe_training(const TrainConfig& config) {
  const auto number = [](double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", v);
    return std::string(text);
  };
  const OptimizerOptions& o = config.optimizer;
  const ScheduleOptions& s = config.schedule;
  std::string text = std::string(optimizer_name(o.kind)) + " lr " + number(o.lr);
  if (o.kind == OptimizerKind::kSgd && o.momentum != 0)
    text += std::string(o.nesterov ? " Nesterov" : "") + " momentum " + number(o.momentum);
  if (o.weight_decay != 0) text += " weight decay " + number(o.weight_decay);
  switch (s.kind) {
    case ScheduleKind::kConstant: text += ", constant rate"; break;
    case ScheduleKind::kStep:
      text += ", step schedule (x" + number(s.gamma) + " every " + std::to_string(s.step_epochs) +
              (s.step_epochs == 1 ? " epoch)" : " epochs)");
      break;
    case ScheduleKind::kOneCycle: text += ", one-cycle schedule"; break;
    case ScheduleKind::kCosine: text += ", cosine schedule"; break;
  }
  if (s.warmup > 0) text += ", " + std::to_string(s.warmup) + " warm-up steps";
  return text;
}

}  // namespace mnist_mt::cli
