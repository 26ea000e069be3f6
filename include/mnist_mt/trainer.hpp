#pragma once
// Data-parallel training over a backend's devices: DDP (a worker thread per device,
// bucketed allreduce overlapping backward) or the DataParallel-style baseline (one host
// thread drives every device). docs/architecture.md decisions 7, 8, 12, 16.
#include <array>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/faults.hpp"
#include "mnist_mt/replica.hpp"
#include "mnist_mt/schedule.hpp"

namespace mnist_mt {

enum class Mode { kDdp, kDp };

// How DDP's ranks combine fc1's weight gradient (docs/distributed.md): an allreduce of
// the gradient, or an allgather of every rank's factors (the gradient at fc1's output and
// its input, B x 9344 floats a rank) from which each rank forms the world's product.
// kAuto takes factors where measured faster: at world batches up to 64 across processes,
// up to 8 in one (factors_pay in src/train/exchange.cpp).
enum class Exchange { kAuto, kGradients, kFactors };


// What a step whose loss or gradient norm is not finite does: stop fails the run naming
// the step and the rank; skip drops that step's update on every rank alike (the decision
// is taken from the reduced gradients, which every rank holds to the same bits).
enum class NanPolicy { kStop, kSkip };

// Asks a running train() to stop (from a signal watcher): stop() lets every rank finish
// the step in flight, then train() saves a checkpoint and returns; abort() releases every
// rank at once and train() throws Interrupted.
class StopRequest {
 public:
  // What a first signal leads to, for the watcher to say: until start_training(), the
  // caller ends before training (nothing to save yet); then train() stops after the
  // step in flight, with a checkpoint or, when there is nowhere to save one, without.
  enum class Outcome { kEndBeforeTraining, kCheckpoint, kNoCheckpoint };
  // A run of several processes (MPI) cannot agree on a step to stop at without an
  // exchange of its own: there the first signal ends the process at once (SignalWatch),
  // and the launcher the others. No file is half-written: checkpoints appear by rename.
  void exit_at_first_signal() { exit_at_first_.store(true); }
  bool exits_at_first_signal() const { return exit_at_first_.load(); }
  // The first signal; `announce`, the watcher's message, hears what it leads to before
  // any thread sees the request.
  void stop(int signal, const std::function<void(Outcome)>& announce = {}) {
    const std::lock_guard lock(mutex_);
    if (announce) announce(outcome_);
    stop_.store(signal);
  }
  // From now on a first signal stops training after the step in flight; `saves`: with a
  // checkpoint. False, changing nothing, when a signal came first: the caller ends.
  bool start_training(bool saves) {
    const std::lock_guard lock(mutex_);
    if (stop_.load() != 0) return false;
    outcome_ = saves ? Outcome::kCheckpoint : Outcome::kNoCheckpoint;
    return true;
  }
  void abort(int signal) { abort_.store(signal); }
  int stop_signal() const { return stop_.load(); }    // 0: none
  int abort_signal() const { return abort_.load(); }  // 0: none

 private:
  std::atomic<int> stop_{0};
  std::atomic<int> abort_{0};
  std::atomic<bool> exit_at_first_{false};
  std::mutex mutex_;  // a first signal and start_training() see each other in one order
  Outcome outcome_ = Outcome::kEndBeforeTraining;
};

struct TrainConfig {
  Mode mode = Mode::kDdp;
  // Device ids; rank i drives devices[i]. An id may repeat: ranks that share a device
  // meet in the local group (mnist_mt/local_group.hpp) instead of the backend's
  // collectives, on every backend, in one process (it runs the multi-rank GPU code on a
  // one-GPU host; the CLI refuses it).
  std::vector<int> devices;
  std::uint32_t epochs = 1;        // the run's total: a resumed run trains what is left
  std::uint32_t batch = 64;        // per device
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  // Stop once the test accuracy (a fraction) reaches this, evaluated every eval_every
  // global steps and at each epoch's end (eval_every 0: at epoch ends only).
  std::optional<double> target_accuracy;
  std::uint32_t eval_every = 0;
  // Lines for the progress stream once a resumed run's start is accepted (the CLI's: the
  // settings and data set it changes from its checkpoint's run, a --seed it does not use),
  // and whether it changes any: its resume note then claims no bit-for-bit run.
  std::vector<std::string> resume_notes;
  bool resume_changes_steps = false;
  // The data set trained on as it was told ("MNIST"; identify_data), which checkpoints
  // record; empty: not told.
  std::string data_name;
  std::uint64_t seed = 1;
  double bucket_mb = 25.0;         // cap of every bucket but the first (which is min(1 MB, cap))
  Exchange exchange = Exchange::kGradients;
  std::optional<std::filesystem::path> load;
  std::optional<std::filesystem::path> save;
  std::uint32_t save_every = 0;    // also save every this many global steps (0: epoch ends only)
  std::uint32_t keep = 1;          // checkpoints kept: >1 names each by its step, `save` links the latest
  // Where a stop request saves when `save` is not given; empty: nowhere, the run stops
  // without a checkpoint (the CLI found no place it may write).
  std::filesystem::path interrupt_save = "mnist_mt-interrupted.safetensors";
  NanPolicy on_nan = NanPolicy::kStop;
  double timeout_s = 600;          // a rank without progress for this long fails the run; 0: never
  StopRequest* stop = nullptr;
  std::optional<std::filesystem::path> metrics;
  // A Chrome trace-event JSON of the first trace_steps steps (DDP), written at the end.
  std::optional<std::filesystem::path> trace;
  std::uint32_t trace_steps = 20;
  // Every DDP step's phases timed on the device (PhaseSeconds). On GPUs that puts a
  // timing event at each phase's end inside the replayed CUDA graph, retargeted before
  // each launch; without it (nor a trace), a replayed step is timed whole
  // (PhaseSeconds::replayed), from outside its graph.
  bool phase_times = false;
  std::uint32_t max_steps = 0;     // per epoch, 0 = all (tests and benchmarks)
  bool evaluate = true;
  std::ostream* progress = nullptr;  // rank 0's progress lines and epoch summaries
  // The processes of an MPI launch (null: this one only). Every process runs train() with
  // the same config and as many devices; its ranks follow the previous process's in the
  // world. World rank 0's process alone writes the metrics, checkpoints and trace, and
  // reports progress and results (the others' TrainResult has no epochs).
  std::shared_ptr<Processes> processes;
  // Faults to meet on purpose (include/mnist_mt/faults.hpp): none by default.
  Faults faults;
};

struct PhaseSeconds {
  double data_wait = 0, forward = 0, backward = 0, comm_wait = 0, optimizer = 0;
  // --mode dp only (0 for ddp): the parameters and the input from device 0 to every
  // device before forward; the outputs to device 0, the loss there and the output
  // gradients back, between forward and backward.
  double broadcast = 0, gather = 0;
  // --mode ddp only: the host's time to enqueue its steps after the batch arrived: the
  // input copy, which first waits until the device is done with the input buffer it
  // reuses (what bounds how far the host runs ahead), and the step's work or its graph's
  // launch.
  double host_launch = 0;
  // --mode ddp, steps replayed as CUDA graphs without TrainConfig::phase_times: their
  // device time, whole (their forward, backward, comm wait and optimizer are not split
  // out, and count 0 there).
  double replayed = 0;
};

// Whether a test accuracy (a fraction) reaches `target` (TrainConfig::target_accuracy):
// one equal to it in decimal counts, such as 1939 of 10000 for 19.39%, which the
// division of the percentage by 100 may round above it.
inline bool reaches_target(double accuracy, double target) { return accuracy >= target - 1e-12; }

struct EpochMetrics {
  std::uint32_t epoch = 0;
  double train_loss = 0;
  double test_loss = 0;
  double test_accuracy = 0;   // fraction
  double images_per_s = 0;    // training images per second, all ranks together
  double seconds = 0;          // training, without the evaluations
  std::uint64_t steps = 0;
  std::uint64_t skipped_steps = 0;  // of `steps`, dropped for a non-finite loss or gradient norm
  PhaseSeconds phase_seconds;  // rank 0's
  std::uint64_t peak_rss_bytes = 0;  // the process's peak resident memory so far
  double eval_seconds = 0;     // evaluating the test set, the epoch's end and --eval-every's
  // --target-accuracy, in the epoch that reached it: the wall time from the run's first
  // step to the end of the evaluation that reached it, the evaluations' share of it, and
  // the global step it was reached at.
  std::optional<double> time_to_target_s;
  std::optional<double> target_eval_seconds;
  std::optional<std::uint64_t> target_step;
  // --mode ddp: how fc1's gradient was exchanged, and the bytes each rank sends per step
  // for each layer (conv1, conv2, fc1, fc2) by a ring's count: an allreduce of C floats
  // among W ranks 2(W-1)/W x C x 4, an allgather of C floats a rank (W-1) x C x 4. The
  // CPU's in-process group moves as much through shared memory.
  bool fc1_factors = false;
  std::optional<std::array<double, 4>> bytes_sent_per_step;
  bool bf16_products = false;  // --precision bf16 (Backend::precision)
  bool tf32 = false;           // --precision tf32 or --tf32 (Backend::tf32)
  // --mode ddp with recorded steps (GPUs): the nodes of world rank 0's recorded step (a
  // CUDA graph's kernels, copies, event records and waits), as a replay launches them.
  std::optional<std::uint64_t> graph_nodes;
  // --mode ddp: every rank took the epoch's steps from a plan on its GPU, each step's
  // rows gathered there (Replica::plan_epoch): no copy from the host.
  bool planned_input = false;
};

struct Interruption {  // a run stopped by StopRequest::stop
  int signal = 0;
  std::filesystem::path checkpoint;
  std::uint32_t epoch = 0;       // epochs completed
  std::uint32_t epoch_step = 0;  // steps done in the next one
  std::uint64_t step = 0;        // global steps done
};

struct TrainResult {
  std::vector<EpochMetrics> epochs;  // the last one reached the target accuracy, if one did
  std::vector<float> params;  // final parameters (rank 0's)
  std::optional<Interruption> interrupted;
};

// Throws InputError for a value train() refuses before it needs the data (a size, a
// rate, an output path that cannot be written), naming the value; InputError::input()
// is its member's name ("batch", "sgd.lr", "bucket_mb", "save", ...). train() checks
// the same, and the batch against the data.
void check_train_config(const TrainConfig& config);

// The flags that shape a run's steps from any position (Checkpoint::settings), as flag and
// value text (numbers in exact_text's form, --nesterov as true or false): the optimizer
// and the settings it reads (not those a one-cycle schedule sets itself: SGD's momentum,
// Adam's betas), the schedule and those it reads (--epochs for the schedules whose length
// it sets), --max-steps and --warmup. A resumed run names those it changes.
std::vector<std::pair<std::string, std::string>> trajectory_settings(const TrainConfig& config);

// A worker failure surfaces as RuntimeFailure("rank R failed at step S: why"); a stall
// longer than timeout_s as RuntimeFailure("rank R stalled at step S in PHASE ..."); an
// abort request as Interrupted.
TrainResult train(Backend& backend, const Dataset& data, const TrainConfig& config);

}  // namespace mnist_mt
