#pragma once
// The training recipes (--recipe) and how the optimizer and schedule flags combine with
// them: a flag given overrides the recipe's value; a value neither gives is torch.optim's
// default for the optimizer used.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mnist_mt/trainer.hpp"

namespace mnist_mt::cli {

// The flags a recipe sets: each empty unless given on the command line.
struct TrainingFlags {
  std::optional<std::string> recipe;
  std::optional<std::string> optimizer;
  std::optional<std::int64_t> epochs;
  std::optional<std::int64_t> batch;  // per device
  std::optional<double> lr;
  std::optional<double> momentum;
  bool nesterov = false;
  std::optional<double> weight_decay;
  std::optional<std::string> betas;  // "B1,B2"
  std::optional<double> eps;
  std::optional<double> rho;
  std::optional<std::string> lr_schedule;
  std::optional<std::int64_t> lr_step;
  std::optional<double> gamma;
  std::optional<std::int64_t> warmup;
};

struct Recipe {
  std::string_view name;
  std::string_view source;  // where its values come from
  OptimizerKind optimizer;
  double lr;
  double momentum;
  bool nesterov;
  double weight_decay;
  ScheduleKind schedule;
  std::uint32_t lr_step;
  double gamma;
  std::uint32_t warmup;
  std::uint32_t epochs;
  std::uint32_t batch;
  bool global_batch;  // `batch` is the world's, split evenly over the ranks; else per rank
};
const std::vector<Recipe>& recipes();

// Sets config's epochs, batch, optimizer and schedule from the flags and the recipe;
// `world`: the run's ranks (a recipe's global batch is split over them). Throws
// InputError naming the flag for an unknown name or a malformed value.
void apply_training_flags(const TrainingFlags& flags, std::size_t world, TrainConfig& config);

// "adamw lr 0.001, cosine schedule, 3 warm-up steps": for the line that starts a run.
std::string describe_training(const TrainConfig& config);

}  // namespace mnist_mt::cli
