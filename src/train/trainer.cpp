#include "mnist_mt/trainer.hpp"

#include "run.hpp"

namespace mnist_mt {

TrainResult train(Backend& backend, const Dataset& data, const TrainConfig& config) {
  Run run(backend, data, config);
  if (config.mode == Mode::kDp) {
    train_dp(run);
  } else {
    train_ddp(run);
  }
  run.rethrow_failure();
  if (TraceLog* trace = run.trace()) runtime_write([&] { trace->write(); });
  return run.take_result();
}

}  // namespace mnist_mt
