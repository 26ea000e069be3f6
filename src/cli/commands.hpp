#pragma once
// The subcommands: training (the default), eval, predict. Each adds its flags to its
// CLI11 app (flags.cpp) and runs from them; errors are InputError (exit 2) or anything
// else (3).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mnist_mt/processes.hpp"
#include "mnist_mt/trainer.hpp"
#include "options.hpp"
#include "recipes.hpp"

namespace mnist_mt::cli {

struct TrainFlags {
  DeviceFlags device;
  DataFlags data;
  std::string mode = "ddp";
  TrainingFlags training;
  std::optional<double> target_accuracy;  // percent
  std::int64_t eval_every = 0;
  std::optional<std::uint64_t> seed;  // none: TrainConfig's, 1
  double bucket_mb = 25.0;
  std::string exchange = "gradients";
  std::optional<std::string> save;
  std::int64_t save_every = 0;
  std::int64_t keep = 1;
  double timeout = 600;
  std::string on_nan = "stop";
  std::optional<std::string> load;
  std::optional<std::string> metrics;
  std::optional<std::string> trace;
  std::int64_t trace_steps = 20;
  bool phase_times = false;
  std::int64_t max_steps = 0;
  std::optional<std::string> inject_fault;
  std::optional<std::string> inject_stall;
  std::optional<std::string> inject_nan;
};
void add_train_flags(CLI::App& app, TrainFlags& f);
// `stop` carries the SIGINT/SIGTERM requests; the exit code is 128 + the signal when
// one stopped the run.
// `processes`: the MPI launch this process is part of, or null.
int run_train(const TrainFlags& f, StopRequest& stop, const std::shared_ptr<Processes>& processes);

struct EvalFlags {
  DeviceFlags device;
  DataFlags data;
  std::string load;
  std::int64_t batch = 64;
  std::optional<std::string> json;
};
void add_eval_flags(CLI::App& app, EvalFlags& f);
int run_eval(const EvalFlags& f);

struct PredictFlags {
  DeviceFlags device;
  DataFlags data;
  std::string load;
  std::vector<std::string> images;
  std::vector<std::int64_t> indices;
};
void add_predict_flags(CLI::App& app, PredictFlags& f);
int run_predict(const PredictFlags& f);

// --version: the version, the backends built, the libraries' versions.
void print_version();

}  // namespace mnist_mt::cli
