// The CUDA replica against the CPU reference (include/mnist_mt/replica.hpp): from the
// same weights and batch, the same log-probabilities, loss, every gradient, and the same
// parameters and momentum after three SGD-momentum steps, within 1e-4 relative, with
// dropout off and on. Needs a GPU (gpu_main.cpp).
//
// The two backends round differently (about 1e-7 relative), so a ReLU input or a max-pool
// window that close to a tie may go one way on each and move a whole gradient
// contribution. Some batches have one, so the comparisons use only batches whose
// decisions all keep a clear margin at every step, checked here in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/device.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/philox.hpp"
#include "cuda/device.hpp"
#include "cuda/device_data.hpp"
#include "model/replica_testing.hpp"

namespace mnist_mt {
namespace {

constexpr double kTolerance = 1e-4;
constexpr int kSteps = 3;
constexpr OptimizerOptions kSgd{0.05f, 0.9f, 5e-4f};
constexpr DropoutKey kKey{7, 2};
// Decisions closer than this to a tie (relative to their layer's largest value) could go
// different ways on the two backends.
constexpr double kMargin = 1e-6;
constexpr std::uint32_t kCandidates = 60;  // batches tried for one with clear decisions

// Images like MNIST's (mostly dark, some ink), random labels, distinct global indices.
Batch make_batch(std::uint32_t size, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(1, 255), label(0, 9);
  std::bernoulli_distribution ink(0.25);
  Batch b;
  b.size = size;
  b.images.resize(std::size_t{size} * kImageBytes);
  b.labels.resize(size);
  for (auto& p : b.images) p = ink(gen) ? static_cast<std::uint8_t>(byte(gen)) : 0;
  for (auto& l : b.labels) l = static_cast<std::uint8_t>(label(gen));
  std::vector<std::uint32_t> all(60000);
  std::iota(all.begin(), all.end(), 0u);
  std::shuffle(all.begin(), all.end(), gen);
  b.indices.assign(all.begin(), all.begin() + size);
  return b;
}

// What a replica produced: the first forward/backward, then the state after kSteps steps.
struct Trace {
  std::vector<float> logprobs;
  std::vector<float> grads;
  double grad_norm = 0;
  StepStats stats;
  std::vector<int> ready;  // layers, in the order backward() reported them
  std::vector<float> momentum_before;
  std::vector<std::vector<float>> params_before;  // at each step
  std::vector<float> params_after;
  std::vector<float> momentum_after;
};

// `held`: the replica holds it (Replica::hold_data), so a batch of one of its splits is
// gathered on the device.
Trace train_steps(Backend& backend, std::uint32_t max_batch, const Batch& batch, bool train,
                  const std::vector<float>& params, const Dataset* held = nullptr) {
  const int ids[] = {0};
  auto devices = backend.make_devices(ids);
  Device& device = *devices[0];
  device.activate();
  auto replica = backend.make_replica(device, max_batch);
  if (held != nullptr) {
    const Samples splits[] = {held->train.samples(), held->test.samples()};
    replica->hold_data(splits);
  }
  replica->write_params(params);

  Trace t;
  t.momentum_before = replica->read_state().first;
  for (int step = 0; step < kSteps; ++step) {
    t.params_before.emplace_back(kParamCount);
    replica->read_params(t.params_before.back());
    replica->set_input(batch);
    replica->forward(train, kKey, batch.size);
    replica->backward([&](int layer) {
      if (step == 0) t.ready.push_back(layer);
    });
    if (step == 0) {
      t.logprobs.resize(std::size_t{batch.size} * kClasses);
      replica->read_logprobs(t.logprobs);
      t.grads.resize(kParamCount);
      ReplicaTesting::read_grads(*replica, t.grads);
      t.grad_norm = replica->grad_norm();
      t.stats = replica->take_stats();
    }
    replica->update(kSgd);
  }
  t.params_after.resize(kParamCount);
  replica->read_params(t.params_after);
  t.momentum_after = replica->read_state().first;
  device.synchronize();
  return t;
}

// How close the ReLUs before the pool, the pool's choice of maximum, and fc1's ReLU are
// to going the other way, each relative to its layer's largest value, for one forward
// pass computed in double. An exact tie in double comes from identical inputs, where
// either choice gives the same gradient, so it is no hazard.
class Margins {
 public:
  void value(double v) { largest_ = std::max(largest_, std::abs(v)); }
  void distance(double d) { closest_ = std::min(closest_, d); }
  double relative() const { return largest_ > 0 ? closest_ / largest_ : 0; }

 private:
  double largest_ = 0;
  double closest_ = std::numeric_limits<double>::infinity();
};

double decision_margin(const std::vector<float>& params, const Batch& batch, bool train) {
  const auto p = [&](int i) { return params.data() + kParams[static_cast<std::size_t>(i)].offset; };
  Margins relu1, pool, fc1;
  std::vector<double> x(kImageBytes), a1(32 * 26 * 26), pooled(9216);
  for (std::uint32_t n = 0; n < batch.size; ++n) {
    for (std::size_t i = 0; i < kImageBytes; ++i)
      x[i] = (static_cast<float>(batch.images[n * kImageBytes + i]) / 255.0f - kInputMean) / kInputStd;
    for (int c = 0; c < 32; ++c)
      for (int h = 0; h < 26; ++h)
        for (int w = 0; w < 26; ++w) {
          double y = p(1)[c];
          for (int k = 0; k < 9; ++k) y += double{p(0)[c * 9 + k]} * x[(h + k / 3) * 28 + w + k % 3];
          relu1.value(y);
          relu1.distance(std::abs(y));
          a1[(c * 26 + h) * 26 + w] = std::max(y, 0.0);
        }
    for (int o = 0; o < 64; ++o)
      for (int ph = 0; ph < 12; ++ph)
        for (int pw = 0; pw < 12; ++pw) {
          double v[4];
          for (int q = 0; q < 4; ++q) {
            const int h = 2 * ph + q / 2, w = 2 * pw + q % 2;
            double y = p(3)[o];
            for (int c = 0; c < 32; ++c)
              for (int k = 0; k < 9; ++k)
                y += double{p(2)[(o * 32 + c) * 9 + k]} * a1[(c * 26 + h + k / 3) * 26 + w + k % 3];
            pool.value(y);
            v[q] = y;
          }
          std::sort(v, v + 4);
          // A dropped window passes no gradient, whichever element it picks.
          const std::uint32_t element = static_cast<std::uint32_t>((o * 12 + ph) * 12 + pw);
          const bool kept = !train || dropout_keep(kKey.seed, kKey.epoch, batch.indices[n], RandomStream::kDropout0,
                                                   element, kDropout1);
          if (kept && v[3] <= 0) {
            pool.distance(-v[3]);  // all four cut by the ReLU
          } else if (kept && v[3] != v[2]) {
            pool.distance(v[3] - std::max(v[2], 0.0));
          }
          pooled[element] = kept ? std::max(v[3], 0.0) : 0.0;
        }
    for (std::uint32_t j = 0; j < 128; ++j) {
      double h = p(5)[j];
      for (int i = 0; i < 9216; ++i) h += double{p(4)[j * 9216 + i]} * pooled[i];
      fc1.value(h);
      if (!train || dropout_keep(kKey.seed, kKey.epoch, batch.indices[n], RandomStream::kDropout1, j, kDropout2))
        fc1.distance(std::abs(h));
    }
  }
  return std::min({relu1.relative(), pool.relative(), fc1.relative()});
}

// A batch from seeds `seed`, `seed`+1, ... whose decisions keep kMargin at every step
// of the CPU's run, and that run.
struct Case {
  Batch batch;
  Trace cpu;
};

Case clear_case(std::uint32_t max_batch, std::uint32_t size, std::uint32_t seed, bool train,
                const std::vector<float>& params) {
  auto cpu = make_cpu_backend({});
  for (std::uint32_t s = seed; s < seed + kCandidates; ++s) {
    Case c{make_batch(size, s), {}};
    c.cpu = train_steps(*cpu, max_batch, c.batch, train, params);
    if (std::all_of(c.cpu.params_before.begin(), c.cpu.params_before.end(),
                    [&](const auto& p) { return decision_margin(p, c.batch, train) >= kMargin; }))
      return c;
  }
  ADD_FAILURE() << "no batch among " << kCandidates << " keeps its decisions " << kMargin << " from a tie";
  return {};
}

// Normwise: the largest difference is within `kTolerance` of the largest reference value.
void expect_close(std::span<const float> got, std::span<const float> want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0, scale = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= worst)) {  // also catches NaN
      worst = d;
      at = i;
    }
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  EXPECT_LE(worst, kTolerance * scale) << what << ": element " << at << " is " << got[at] << ", the CPU has "
                                       << want[at] << " (largest magnitude " << scale << ")";
}

// Tensor by tensor in state-dict order, so a small tensor is not judged by a large one.
void expect_params_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  for (const ParamInfo& p : kParams) {
    expect_close(std::span(got).subspan(p.offset, p.count), std::span(want).subspan(p.offset, p.count),
                 what + " " + std::string(p.name));
  }
}

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

void expect_cuda_matches_cpu(std::uint32_t max_batch, std::uint32_t size, std::uint32_t seed, bool train,
                             const BackendOptions& options) {
  const std::vector<float> params = initial_parameters(seed);
  const Case c = clear_case(max_batch, size, seed, train, params);
  if (c.batch.size == 0) return;
  auto cuda = make_cuda_backend(options);
  const Trace& want = c.cpu;
  const Trace got = train_steps(*cuda, max_batch, c.batch, train, params);

  expect_close(got.logprobs, want.logprobs, "log-probabilities");
  EXPECT_NEAR(got.stats.loss_sum, want.stats.loss_sum, kTolerance * std::abs(want.stats.loss_sum));
  EXPECT_EQ(got.stats.correct, want.stats.correct);
  EXPECT_EQ(got.stats.samples, size);
  EXPECT_EQ(got.ready, (std::vector<int>{kFc2, kFc1, kConv2, kConv1}));
  expect_params_close(got.grads, want.grads, "gradient of");
  // Each norm against its own gradients (exactly summed in double), then the two alike.
  for (const Trace* t : {&got, &want}) {
    double squares = 0;
    for (float v : t->grads) squares += double{v} * v;
    EXPECT_NEAR(t->grad_norm, std::sqrt(squares), 1e-12 * std::sqrt(squares));
  }
  EXPECT_NEAR(got.grad_norm, want.grad_norm, kTolerance * want.grad_norm);
  EXPECT_TRUE(std::all_of(got.momentum_before.begin(), got.momentum_before.end(), [](float m) { return m == 0; }));
  expect_params_close(got.params_after, want.params_after, "after 3 steps,");
  // The steps are small against the weights: compare what they changed too.
  expect_params_close(minus(got.params_after, params), minus(want.params_after, params), "change in");
  expect_params_close(got.momentum_after, want.momentum_after, "momentum of");
}

TEST(CudaReplica, MatchesCpuWithoutDropout) {
  expect_cuda_matches_cpu(4, 4, 1, false, {});
}

TEST(CudaReplica, MatchesCpuWithDropout) {
  expect_cuda_matches_cpu(4, 4, 100, true, {});
}

// A batch smaller than the replica's largest (the last one of an evaluation) runs with
// algorithms chosen for its own size.
TEST(CudaReplica, MatchesCpuOnABatchSmallerThanItsMaximum) {
  expect_cuda_matches_cpu(16, 3, 200, true, {});
}

TEST(CudaReplica, MatchesCpuWithDeterministicAlgorithms) {
  BackendOptions options;
  options.deterministic = true;
  expect_cuda_matches_cpu(4, 4, 300, true, options);
}

TEST(CudaReplica, DeterministicAlgorithmsRepeatBitForBit) {
  BackendOptions options;
  options.deterministic = true;
  auto cuda = make_cuda_backend(options);
  const Batch batch = make_batch(64, 5);
  const std::vector<float> params = initial_parameters(5);
  const Trace a = train_steps(*cuda, 64, batch, true, params);
  const Trace b = train_steps(*cuda, 64, batch, true, params);
  EXPECT_EQ(0, std::memcmp(a.grads.data(), b.grads.data(), kParamCount * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.params_after.data(), b.params_after.data(), kParamCount * sizeof(float)));
}

// Without this the dropout comparison could pass with dropout missing on both sides.
TEST(CudaReplica, DropoutChangesTheForwardPass) {
  auto cuda = make_cuda_backend({});
  const Batch batch = make_batch(16, 6);
  const std::vector<float> params = initial_parameters(6);
  const Trace on = train_steps(*cuda, 16, batch, true, params);
  const Trace off = train_steps(*cuda, 16, batch, false, params);
  double diff = 0;
  for (std::size_t i = 0; i < on.logprobs.size(); ++i)
    diff = std::max(diff, static_cast<double>(std::abs(on.logprobs[i] - off.logprobs[i])));
  EXPECT_GT(diff, 1e-3);
}

TEST(CudaReplica, BatchMayBeReusedOnceSetInputReturns) {
  auto cuda = make_cuda_backend({});
  const int ids[] = {0};
  auto devices = cuda->make_devices(ids);
  devices[0]->activate();
  auto replica = cuda->make_replica(*devices[0], 8);
  replica->write_params(initial_parameters(8));
  const Batch batch = make_batch(8, 8);
  std::vector<float> first(8 * kClasses), second(8 * kClasses);

  replica->set_input(batch);
  replica->forward(false, {}, 8);
  replica->read_logprobs(first);

  Batch scratch = batch;
  replica->set_input(scratch);
  std::fill(scratch.images.begin(), scratch.images.end(), std::uint8_t{255});
  std::fill(scratch.labels.begin(), scratch.labels.end(), std::uint8_t{9});
  replica->forward(false, {}, 8);
  replica->read_logprobs(second);
  EXPECT_EQ(first, second);
}

// A split of `size` samples like make_batch's, and a batch of `rows` of them (repeats
// included) as the loader hands it over: images copied, split set.
Dataset dataset_of(std::uint32_t size, std::uint32_t seed) {
  const Batch all = make_batch(size, seed);
  Dataset d;
  d.train.images = all.images;
  d.train.labels = all.labels;
  d.test = d.train;
  return d;
}

Batch batch_of(const Split& split, std::uint32_t rows) {
  Batch b;
  b.size = rows;
  b.epoch = 3;
  b.split_images = split.images.data();
  for (std::uint32_t r = 0; r < rows; ++r) {
    const std::uint32_t index = r == 1 ? 0 : (r * 37u + split.size() - 1) % split.size();
    b.indices.push_back(index);
    b.labels.push_back(split.labels[index]);
    b.images.insert(b.images.end(), split.image(index), split.image(index) + kImageBytes);
  }
  return b;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what;
}

// The data set in device memory (--gpus without --no-device-data): a batch of a held split
// crosses as its indices, and trains bit for bit as its copied images do. The held batch's
// host images are blanked, so only the gather can give the copied batch's result.
TEST(CudaReplica, ABatchGatheredFromTheHeldDataTrainsAsItsCopy) {
  const Dataset data = dataset_of(200, 21);
  auto cuda = make_cuda_backend({});
  const std::vector<float> params = initial_parameters(21);
  for (const Split* split : {&data.train, &data.test}) {
    Batch copied = batch_of(*split, 16);
    Batch held = copied;
    copied.split_images = nullptr;
    std::fill(held.images.begin(), held.images.end(), std::uint8_t{0});
    std::fill(held.labels.begin(), held.labels.end(), std::uint8_t{0});
    const Trace want = train_steps(*cuda, 16, copied, true, params);
    const Trace got = train_steps(*cuda, 16, held, true, params, &data);
    expect_same_bits(got.logprobs, want.logprobs, "log-probabilities");
    expect_same_bits(got.grads, want.grads, "gradients");
    expect_same_bits(got.params_after, want.params_after, "parameters after 3 steps");
    EXPECT_EQ(got.stats.correct, want.stats.correct);
    // Not vacuous: the blanked images, copied, train otherwise.
    held.split_images = nullptr;
    const Trace blank = train_steps(*cuda, 16, held, true, params);
    EXPECT_NE(0, std::memcmp(blank.logprobs.data(), want.logprobs.data(), want.logprobs.size() * sizeof(float)));
  }
  // Held, but not given a split (or an index past it): the images are copied.
  Batch elsewhere = batch_of(data.train, 8);
  elsewhere.split_images = nullptr;
  const Trace copied = train_steps(*cuda, 8, elsewhere, true, params);
  expect_same_bits(train_steps(*cuda, 8, elsewhere, true, params, &data).logprobs, copied.logprobs, "no split");
  Batch past = batch_of(data.train, 8);
  past.indices[3] = data.train.size() + 5;  // dropout keys by index: compare with the same one copied
  elsewhere.indices[3] = past.indices[3];
  expect_same_bits(train_steps(*cuda, 8, past, true, params, &data).logprobs,
                   train_steps(*cuda, 8, elsewhere, true, params).logprobs, "an index past the split");
  // With BackendOptions::device_data off the blanked batch is copied, blank.
  BackendOptions off;
  off.device_data = false;
  auto host_data = make_cuda_backend(off);
  Batch blanked = batch_of(data.train, 8);
  std::fill(blanked.images.begin(), blanked.images.end(), std::uint8_t{0});
  const Trace off_trace = train_steps(*host_data, 8, blanked, true, params, &data);
  blanked.split_images = nullptr;
  expect_same_bits(off_trace.logprobs, train_steps(*cuda, 8, blanked, true, params).logprobs, "device_data off");
}

// An epoch planned on the device (Replica::plan_epoch): set_input() of the planned
// batches in order copies nothing and forward() gathers each step's rows, bit for bit as
// copied batches train. A batch out of the plan's order is an error and ends the plan;
// the same batch again is then gathered by its indices. A step whose recording is dropped
// (as StepGraphs drops a failed one, then enqueues the step) still gathers its rows once.
class PlannedEpoch : public ::testing::Test {
 protected:
  static constexpr std::uint32_t kRows = 8;
  static constexpr DropoutKey kPlanKey{7, 3};  // the batches' epoch: a recorded forward checks it

  void SetUp() override {
    for (std::uint32_t k = 0; k < 5 * kRows; ++k) plan_.push_back((k * 53u + 3u) % data_.train.size());
  }

  // Step `step` of the plan as the loader hands it; `blank`: its host images and labels
  // zero, so that only a gather can train on the right ones.
  Batch batch_at(std::uint32_t step, bool blank) const {
    Batch b = batch_of(data_.train, kRows);
    b.step = step;
    for (std::uint32_t r = 0; r < kRows; ++r) {
      b.indices[r] = plan_[step * kRows + r];
      b.labels[r] = blank ? 0 : data_.train.labels[b.indices[r]];
      for (std::size_t p = 0; p < kImageBytes; ++p)
        b.images[r * kImageBytes + p] = blank ? 0 : data_.train.image(b.indices[r])[p];
    }
    return b;
  }

  struct Run {
    std::unique_ptr<Backend> backend = make_cuda_backend({});
    std::vector<std::unique_ptr<Device>> devices;
    std::unique_ptr<Replica> replica;
    std::vector<float> trained;  // each step's log-probabilities, then the parameters
  };

  Run start(bool planned) const {
    Run run;
    const int ids[] = {0};
    run.devices = run.backend->make_devices(ids);
    run.devices[0]->activate();
    run.replica = run.backend->make_replica(*run.devices[0], kRows);
    const Samples splits[] = {data_.train.samples(), data_.test.samples()};
    run.replica->hold_data(splits);
    run.replica->write_params(params_);
    if (planned) {
      EXPECT_TRUE(run.replica->plan_epoch(data_.train.images.data(), 3, plan_, kRows));
    }
    return run;
  }

  // The step after set_input(): forward (recorded and dropped first, if asked), backward,
  // update; its log-probabilities kept.
  static void train(Run& run, bool dropped_recording = false) {
    if (dropped_recording) {
      // As the communicators of a run of one rank on its GPU allow it (cuda::make_communicators).
      static_cast<cuda::CudaDevice&>(*run.devices[0]).allow_record(true);
      run.devices[0]->begin_record();
      run.replica->forward(true, kPlanKey, kRows);
      std::string why = "dropped";
      EXPECT_EQ(run.devices[0]->end_record(why), nullptr);
    }
    run.replica->forward(true, kPlanKey, kRows);
    run.replica->backward([](int) {});
    run.replica->update(kSgd);
    std::vector<float> logprobs(kRows * kClasses);
    run.replica->read_logprobs(logprobs);
    run.trained.insert(run.trained.end(), logprobs.begin(), logprobs.end());
  }

  static std::vector<float> finish(Run& run) {
    std::vector<float> after(kParamCount);
    run.replica->read_params(after);
    run.trained.insert(run.trained.end(), after.begin(), after.end());
    return run.trained;
  }

  // The same steps with their batches copied.
  std::vector<float> copied(std::initializer_list<std::uint32_t> steps) const {
    Run run = start(false);
    for (const std::uint32_t step : steps) {
      Batch b = batch_at(step, false);
      b.split_images = nullptr;
      run.replica->set_input(b);
      train(run);
    }
    return finish(run);
  }

  const Dataset data_ = dataset_of(120, 24);
  const std::vector<float> params_ = initial_parameters(24);
  std::vector<std::uint32_t> plan_;
};

TEST_F(PlannedEpoch, TrainsAsItsCopiedBatches) {
  Run run = start(true);
  std::vector<int> slots;
  for (const std::uint32_t step : {0u, 1u, 2u}) {
    run.replica->set_input(batch_at(step, true));
    slots.push_back(run.replica->input_buffer());
    train(run);
  }
  EXPECT_THROW(run.replica->set_input(batch_at(4, false)), RuntimeFailure) << "step 4 is not the plan's next";
  for (const std::uint32_t step : {4u, 3u}) {  // the plan ended: gathered by their indices
    run.replica->set_input(batch_at(step, false));
    slots.push_back(run.replica->input_buffer());
    train(run);
  }
  expect_same_bits(finish(run), copied({0, 1, 2, 4, 3}), "log-probabilities of each step and the parameters after");
  EXPECT_EQ(std::vector<int>(slots.begin(), slots.begin() + 3), std::vector<int>(3, 2))
      << "the planned steps read the plan's buffer";
  EXPECT_NE(slots[3], 2);
  EXPECT_NE(slots[4], 2);
}

TEST_F(PlannedEpoch, AStepWhoseRecordingIsDroppedGathersItsRowsOnce) {
  Run run = start(true);
  for (const std::uint32_t step : {0u, 1u}) {
    run.replica->set_input(batch_at(step, true));
    train(run, step == 0);
  }
  expect_same_bits(finish(run), copied({0, 1}), "log-probabilities of each step and the parameters after");
}

TEST_F(PlannedEpoch, APlanThatDoesNotFitIsNone) {
  Run run = start(false);
  const std::uint8_t elsewhere[kImageBytes] = {};
  EXPECT_FALSE(run.replica->plan_epoch(elsewhere, 3, plan_, kRows)) << "a split not held";
  EXPECT_FALSE(run.replica->plan_epoch(data_.train.images.data(), 3, plan_, kRows + 1)) << "rows over the maximum";
  std::vector<std::uint32_t> past = plan_;
  past[5] = data_.train.size();
  EXPECT_FALSE(run.replica->plan_epoch(data_.train.images.data(), 3, past, kRows)) << "an index past the split";
  EXPECT_FALSE(run.replica->plan_epoch(data_.train.images.data(), 3, {}, kRows)) << "no samples";
  run.replica->set_input(batch_at(0, false));  // with no plan, any order
  EXPECT_NE(run.replica->input_buffer(), 2);
}

// Ranks that share a GPU share one copy of a split; another content is another copy.
TEST(CudaReplica, RanksOnOneGpuHoldOneCopyOfTheData) {
  Dataset data = dataset_of(100, 22);
  cuda::CudaDevice a(0), b(0);
  a.activate();
  const auto first = cuda::hold_split(a, data.train.samples());
  b.activate();
  const auto second = cuda::hold_split(b, data.train.samples());
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first.get(), second.get());
  EXPECT_EQ(first->size(), 100u);
  data.train.images[5] ^= 1;
  const auto changed = cuda::hold_split(b, data.train.samples());
  ASSERT_NE(changed, nullptr);
  EXPECT_NE(changed.get(), first.get());
}

TEST(CudaReplica, TakeStatsCountsAndResets) {
  auto cuda = make_cuda_backend({});
  const int ids[] = {0};
  auto devices = cuda->make_devices(ids);
  devices[0]->activate();
  auto replica = cuda->make_replica(*devices[0], 16);
  replica->write_params(initial_parameters(9));
  for (std::uint32_t n : {16u, 7u}) {
    replica->set_input(make_batch(n, n));
    replica->forward(false, {}, n);
  }
  const StepStats s = replica->take_stats();
  EXPECT_EQ(s.samples, 23);
  EXPECT_GE(s.correct, 0);
  EXPECT_LE(s.correct, 23);
  EXPECT_GT(s.loss_sum, 0);
  const StepStats empty = replica->take_stats();
  EXPECT_EQ(empty.samples, 0);
  EXPECT_EQ(empty.loss_sum, 0);
}

// The device decides a guarded update: a finite step is update()'s bit for bit; a NaN
// parameter (NaN loss and gradients) drops it, halts the replica and is reported with its
// step (the guard's first step plus the updates before it, counted on the device) in the
// next snapshot, which is read without waiting once made.
TEST(CudaReplica, AGuardedUpdateIsDecidedOnTheDevice) {
  constexpr std::uint64_t kFirst = 40;
  // Deterministic algorithms: the two replicas' gradients are then the same bits, so the
  // updates can be compared bit for bit.
  BackendOptions deterministic;
  deterministic.deterministic = true;
  auto cuda = make_cuda_backend(deterministic);
  const int ids[] = {0};
  auto devices = cuda->make_devices(ids);
  devices[0]->activate();
  const OptimizerOptions sgd{0.01f, 0.9f, 0.0f};
  const std::vector<float> params = initial_parameters(10);
  auto plain = cuda->make_replica(*devices[0], 8);
  auto guarded = cuda->make_replica(*devices[0], 8);
  const auto step = [&](Replica& r, std::uint32_t seed) {
    r.set_input(make_batch(8, seed));
    r.forward(true, {1, 0}, 8);
    r.backward([](int) {});
  };
  const auto read = [](Replica& r) {
    std::vector<float> p(kParamCount);
    r.read_params(p);
    return p;
  };
  plain->write_params(params);
  guarded->write_params(params);
  for (std::uint32_t k = 0; k < 2; ++k) {
    step(*plain, k);
    plain->update(sgd);
    step(*guarded, k);
    guarded->guarded_update(sgd, {kFirst, true, {}});
  }
  EXPECT_EQ(read(*guarded), read(*plain));
  const std::uint64_t applied = guarded->snapshot_stats();
  const StepStats a = *guarded->read_stats(applied, true);
  EXPECT_EQ(a.samples, 16);
  EXPECT_EQ(a.skipped, 0u);
  EXPECT_FALSE(a.non_finite);

  const std::vector<float> good = read(*guarded);
  std::vector<float> poisoned = good;
  poisoned.back() = std::nanf("");
  guarded->write_params(poisoned);
  step(*guarded, 3);
  guarded->guarded_update(sgd, {kFirst, true, {}});  // update 2
  guarded->write_params(good);
  step(*guarded, 4);
  guarded->guarded_update(sgd, {kFirst, true, {}});
  EXPECT_EQ(read(*guarded), good) << "a halted replica applies nothing";
  const StepStats h = *guarded->read_stats(guarded->snapshot_stats(), true);
  EXPECT_EQ(h.samples, 0);
  EXPECT_EQ(h.skipped, 2u);
  ASSERT_TRUE(h.non_finite);
  EXPECT_EQ(h.non_finite->step, kFirst + 2);
  EXPECT_TRUE(std::isnan(h.non_finite->grad_norm));
}

// Marks on the streams: readable once passed, in order, on the host's clock.
TEST(CudaDevice, MarksAreReadOnceTheStreamPassedThem) {
  auto cuda = make_cuda_backend({});
  const int ids[] = {0};
  auto devices = cuda->make_devices(ids);
  Device& d = *devices[0];
  d.activate();
  const TimeMark a = d.mark(Lane::kCompute);
  const TimeMark c = d.mark(Lane::kComm);
  const TimeMark b = d.mark(Lane::kCompute);
  d.synchronize();
  ASSERT_TRUE(d.mark_time(a) && d.mark_time(b) && d.mark_time(c));
  EXPECT_LE(*d.mark_time(a), *d.mark_time(b));
  ASSERT_TRUE(d.elapsed(a, b));
  EXPECT_GE(*d.elapsed(a, b), 0.0);
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  EXPECT_LE(*d.mark_time(b), now + 1e-3);
}

}  // namespace
}  // namespace mnist_mt
