// The oneDNN replica against PyTorch (tests/golden), against a float64 reference of the
// network with its finite-difference gradients, and the replica's contract with the
// trainer (callback order, asynchrony, batch sizes, statistics, optimizer state).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <numeric>
#include <random>
#include <thread>

#include "cpu/device.hpp"
#include "cpu/replica.hpp"
#include "golden/fixture.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/philox.hpp"
#include "model/replica_testing.hpp"
#include "mnist_mt/schedule.hpp"
#include "optimizer_cases.hpp"

namespace mnist_mt::cpu {
namespace {

using testing::Fixture;
using testing::golden;
using testing::golden_dir;

Batch make_batch(const std::vector<std::uint8_t>& images, const std::vector<std::uint8_t>& labels,
                 const std::vector<std::uint32_t>& indices) {
  Batch b;
  b.size = static_cast<std::uint32_t>(labels.size());
  b.images = images;
  b.labels = labels;
  b.indices = indices;
  return b;
}

Batch random_batch(std::uint32_t size, std::uint32_t seed, std::uint32_t first_index = 0) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> images(size * kImageBytes), labels(size);
  for (auto& v : images) v = static_cast<std::uint8_t>(rng());
  for (auto& v : labels) v = static_cast<std::uint8_t>(rng() % kClasses);
  std::vector<std::uint32_t> indices(size);
  std::iota(indices.begin(), indices.end(), first_index);
  return make_batch(images, labels, indices);
}

// Ours against `want` (float64 PyTorch, rounded to fp32): within 1e-5 relative, plus an
// absolute floor of 1e-5 of the tensor's largest magnitude. The floor is for elements near
// zero through cancellation: an fp32 sum of thousands of products (a conv weight's
// gradient sums 8 x 676 of them) is off by ~1e-6 of its largest terms (measured: at most
// 2e-6 of the largest element), which no relative tolerance of a near-zero result covers.
void expect_close(const std::vector<float>& ours, const std::vector<float>& want, const std::string& what) {
  constexpr double kRelative = 1e-5;
  ASSERT_EQ(ours.size(), want.size()) << what;
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::abs(double{w}));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const double err = std::abs(double{ours[i]} - want[i]);
    if (err > kRelative * (std::abs(double{want[i]}) + scale) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << ours[i] << " vs " << want[i];
  }
  EXPECT_EQ(bad, 0u) << what;
}

// The elements of a param that a fixture stores: all, or every stride-th of fc1.weight.
std::vector<float> fixture_view(const std::vector<float>& flat, const ParamInfo& p) {
  const std::size_t stride = p.name == "fc1.weight" ? std::stoul(golden().meta("fc1_weight_stride")) : 1;
  std::vector<float> out;
  for (std::size_t i = 0; i < p.count; i += stride) out.push_back(flat[p.offset + i]);
  return out;
}

class ReplicaTest : public ::testing::Test {
 protected:
  CpuDevice device_{0};
};

TEST_F(ReplicaTest, MatchesPyTorchGolden) {
  const Fixture& g = golden();
  auto replica = make_cpu_replica(device_, 8);
  replica->write_params(load_checkpoint(golden_dir() / "torch_init.safetensors").params);
  const Batch batch = make_batch(g.get<std::uint8_t>("images"), g.get<std::uint8_t>("labels"), {0, 1, 2, 3, 4, 5, 6, 7});
  const DropoutKey key{1, 0};

  replica->set_input(batch);
  replica->forward(false, key, 8);
  std::vector<float> logp(8 * kClasses);
  replica->read_logprobs(logp);
  expect_close(logp, g.get<float>("logprobs"), "logprobs");
  const StepStats stats = replica->take_stats();
  EXPECT_EQ(stats.samples, 8);
  EXPECT_NEAR(stats.loss_sum / 8, g.get<double>("loss")[0], 1e-5 * g.get<double>("loss")[0]);

  replica->backward([](int) {});
  std::vector<float> grads(kParamCount);
  ReplicaTesting::read_grads(*replica, grads);
  for (const ParamInfo& p : kParams)
    expect_close(fixture_view(grads, p), g.get<float>("grad." + std::string(p.name)), "grad." + std::string(p.name));
  double squares = 0;
  for (float v : grads) squares += double{v} * v;
  EXPECT_NEAR(replica->grad_norm(), std::sqrt(squares), 1e-12 * std::sqrt(squares));

  const OptimizerOptions sgd{0.01f, 0.9f, 1e-4f};
  replica->update(sgd);
  for (int step = 1; step < 3; ++step) {
    replica->set_input(batch);
    replica->forward(false, key, 8);
    replica->backward([](int) {});
    replica->update(sgd);
  }
  std::vector<float> params(kParamCount);
  replica->read_params(params);
  const OptimizerState state = replica->read_state();
  EXPECT_EQ(state.applied, 3u);
  const std::vector<float>& momentum = state.first;
  for (const ParamInfo& p : kParams) {
    expect_close(fixture_view(params, p), g.get<float>("step3." + std::string(p.name)), "step3." + std::string(p.name));
    expect_close(fixture_view(momentum, p), g.get<float>("momentum3." + std::string(p.name)),
                 "momentum3." + std::string(p.name));
  }
}

// Twenty updates of each optimizer (and AdamW under OneCycleLR, its rate and beta1 set
// per update) from PyTorch's initial weights on the golden batch, dropout off, within
// 1e-5 (relative, normwise, per tensor; Adam 2e-5) of torch.optim's in float64
// (tests/golden/gen_optimizers.py).
TEST_F(ReplicaTest, OptimizersTrainAsTorchOptim) {
  const Fixture& g = golden();
  const Fixture& f = testing::optimizer_fixture();
  const auto cases = nlohmann::json::parse(f.meta("net_cases"));
  const std::uint64_t steps = std::stoul(f.meta("net_steps"));
  const Batch batch = make_batch(g.get<std::uint8_t>("images"), g.get<std::uint8_t>("labels"), {0, 1, 2, 3, 4, 5, 6, 7});
  const std::vector<float> init = load_checkpoint(golden_dir() / "torch_init.safetensors").params;
  for (const auto& [name, spec] : cases.items()) {
    SCOPED_TRACE(name);
    const OptimizerOptions o = testing::fixture_case(spec[0].get<std::string>());
    // Adam divides each gradient by its own running size: float32's rounding of the
    // near-zero gradients becomes steps of lr, 1.4e-5 of fc1's weights after 20 updates.
    const bool adam = o.kind == OptimizerKind::kAdam || o.kind == OptimizerKind::kAdamW;
    ScheduleOptions s;
    if (spec[1] == "onecycle") s.kind = ScheduleKind::kOneCycle;
    const Schedule schedule(s, o, steps, 1);
    auto replica = make_cpu_replica(device_, 8);
    replica->write_params(init);
    for (std::uint64_t step = 0; step < steps; ++step) {
      replica->set_input(batch);
      replica->forward(false, {1, 0}, 8);
      replica->backward([](int) {});
      replica->update(with_values(o, schedule.at(step)));
    }
    std::vector<float> params(kParamCount);
    replica->read_params(params);
    EXPECT_NE(params, init);
    for (const ParamInfo& p : kParams) {
      const std::vector<float> ours = fixture_view(params, p);
      const std::vector<float> want = f.get<float>("net." + name + "." + std::string(p.name));
      ASSERT_EQ(ours.size(), want.size());
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        diff += (double{ours[i]} - want[i]) * (double{ours[i]} - want[i]);
        norm += double{want[i]} * want[i];
      }
      EXPECT_LE(std::sqrt(diff / norm), adam ? 2e-5 : 1e-5) << name << "." << p.name;
    }
  }
}

// ---- A float64 reference of the network, written from its definition (docs/architecture.md). ----

struct RefSample {
  std::vector<double> x;  // 28x28, normalised with the fp32 operations of ToTensor + Normalize
  std::uint8_t label;
  std::uint32_t index;
};

std::vector<RefSample> ref_samples(const Batch& b) {
  std::vector<RefSample> out(b.size);
  for (std::uint32_t n = 0; n < b.size; ++n) {
    out[n].x.resize(kImageBytes);
    for (std::size_t i = 0; i < kImageBytes; ++i)
      out[n].x[i] = (static_cast<float>(b.images[n * kImageBytes + i]) / 255.0f - kInputMean) / kInputStd;
    out[n].label = b.labels[n];
    out[n].index = b.indices[n];
  }
  return out;
}

double relu(double v) { return v > 0 ? v : 0; }

double ref_dropout(double v, const DropoutKey* key, const RefSample& s, RandomStream stream, std::uint32_t e,
                   float p) {
  if (key == nullptr) return v;
  return dropout_keep(key->seed, key->epoch, s.index, stream, e, p) ? v / (1.0 - p) : 0.0;
}

// conv1 -> ReLU -> conv2 -> ReLU -> max_pool2d(2) -> dropout -> flatten: fc1's input.
std::vector<double> ref_features(const std::vector<double>& p, const RefSample& s, const DropoutKey* key) {
  const double* w1 = p.data() + kParams[0].offset;
  const double* b1 = p.data() + kParams[1].offset;
  const double* w2 = p.data() + kParams[2].offset;
  const double* b2 = p.data() + kParams[3].offset;
  constexpr int kC1 = kConv1Channels, kS1 = kConv1Side, kC2 = kConv2Channels, kS2 = kConv2Side, kP = kPoolSide;
  constexpr int kIn = kImageSide, kPlane2 = kS2 * kS2;
  std::vector<double> a1(kC1 * kS1 * kS1), a2(kC2 * kPlane2), out(kFlat);
  for (int c = 0; c < kC1; ++c)
    for (int y = 0; y < kS1; ++y)
      for (int x = 0; x < kS1; ++x) {
        double v = b1[c];
        for (int ky = 0; ky < 3; ++ky)
          for (int kx = 0; kx < 3; ++kx) v += w1[c * 9 + ky * 3 + kx] * s.x[(y + ky) * kIn + x + kx];
        a1[(c * kS1 + y) * kS1 + x] = relu(v);
      }
  for (int o = 0; o < kC2; ++o) {
    double* dst = a2.data() + o * kPlane2;
    std::fill(dst, dst + kPlane2, b2[o]);
    for (int i = 0; i < kC1; ++i)
      for (int ky = 0; ky < 3; ++ky)
        for (int kx = 0; kx < 3; ++kx) {
          const double w = w2[((o * kC1 + i) * 3 + ky) * 3 + kx];
          for (int y = 0; y < kS2; ++y)
            for (int x = 0; x < kS2; ++x) dst[y * kS2 + x] += w * a1[(i * kS1 + y + ky) * kS1 + x + kx];
        }
    for (int i = 0; i < kPlane2; ++i) dst[i] = relu(dst[i]);
  }
  for (int c = 0; c < kC2; ++c)
    for (int y = 0; y < kP; ++y)
      for (int x = 0; x < kP; ++x) {
        const double* q = a2.data() + (c * kS2 + 2 * y) * kS2 + 2 * x;
        const double m = std::max({q[0], q[1], q[kS2], q[kS2 + 1]});
        const auto e = static_cast<std::uint32_t>((c * kP + y) * kP + x);
        out[e] = ref_dropout(m, key, s, RandomStream::kDropout0, e, kDropout1);
      }
  return out;
}

// fc1 -> ReLU -> dropout -> fc2 -> log_softmax.
std::array<double, kClasses> ref_head(const std::vector<double>& p, const std::vector<double>& features,
                                      const RefSample& s, const DropoutKey* key) {
  const double* w1 = p.data() + kParams[4].offset;
  const double* b1 = p.data() + kParams[5].offset;
  const double* w2 = p.data() + kParams[6].offset;
  const double* b2 = p.data() + kParams[7].offset;
  std::array<double, kHidden> h{};
  for (std::size_t j = 0; j < kHidden; ++j) {
    double v = b1[j];
    for (std::size_t e = 0; e < kFlat; ++e) v += w1[j * kFlat + e] * features[e];
    h[j] = ref_dropout(relu(v), key, s, RandomStream::kDropout1, static_cast<std::uint32_t>(j), kDropout2);
  }
  std::array<double, kClasses> z{};
  for (std::size_t k = 0; k < kClasses; ++k) {
    z[k] = b2[k];
    for (std::size_t j = 0; j < kHidden; ++j) z[k] += w2[k * kHidden + j] * h[j];
  }
  const double m = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (double v : z) sum += std::exp(v - m);
  for (double& v : z) v -= m + std::log(sum);
  return z;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Mean NLL of the batch; `features` caches ref_features when only fc1/fc2 change.
double ref_loss(const std::vector<double>& p, const std::vector<RefSample>& samples, const DropoutKey* key,
                const std::vector<std::vector<double>>* features = nullptr) {
  double loss = 0;
  for (std::size_t n = 0; n < samples.size(); ++n) {
    const auto f = features != nullptr ? (*features)[n] : ref_features(p, samples[n], key);
    loss -= ref_head(p, f, samples[n], key)[samples[n].label];
  }
  return loss / static_cast<double>(samples.size());
}

std::vector<float> logprobs(Replica& replica, const Batch& batch, bool train, const DropoutKey& key) {
  replica.set_input(batch);
  replica.forward(train, key, batch.size);
  std::vector<float> out(batch.size * kClasses);
  replica.read_logprobs(out);
  return out;
}

// Dropout on: the replica's log-probabilities equal the reference's, whose masks come from
// dropout_keep() and whose kept values are scaled by 1/(1-p); dropout off likewise.
TEST_F(ReplicaTest, DropoutMatchesReference) {
  const auto params = initial_parameters(21);
  const Batch batch = make_batch(random_batch(3, 5).images, {1, 7, 3}, {5, 17, 40000});
  auto replica = make_cpu_replica(device_, 3);
  replica->write_params(params);
  const auto p = to_double(params);
  const auto samples = ref_samples(batch);
  const DropoutKey key{0x1234567890ull, 4};
  const auto train = logprobs(*replica, batch, true, key);
  const auto eval = logprobs(*replica, batch, false, key);
  double moved = 0;
  for (std::size_t n = 0; n < samples.size(); ++n) {
    const auto want_train = ref_head(p, ref_features(p, samples[n], &key), samples[n], &key);
    const auto want_eval = ref_head(p, ref_features(p, samples[n], nullptr), samples[n], nullptr);
    for (std::size_t k = 0; k < kClasses; ++k) {
      EXPECT_NEAR(train[n * kClasses + k], want_train[k], 1e-5 * std::abs(want_train[k]) + 1e-6) << n << " " << k;
      EXPECT_NEAR(eval[n * kClasses + k], want_eval[k], 1e-5 * std::abs(want_eval[k]) + 1e-6) << n << " " << k;
      moved = std::max(moved, std::abs(want_train[k] - want_eval[k]));
    }
  }
  EXPECT_GT(moved, 1e-2);  // dropout changed the outputs enough for the comparison to tell
}

// The replica's gradients (dropout on) against central differences of the float64
// reference loss, on a sample of every layer's weights and biases: the elements with the
// largest gradients, two further down the order and two random ones. h = 1e-6: float64
// rounding stays ~1e-9, and the step crosses almost no ReLU/max kink (a bias shifts a whole
// channel; at h = 1e-5 one crossing already moved conv1.bias's difference by 1e-3). The
// fp32 gradients agree within ~1e-6 relative.
TEST_F(ReplicaTest, GradientsMatchFiniteDifferences) {
  const auto params = initial_parameters(33);
  const Batch batch = random_batch(2, 9, 100);
  const DropoutKey key{77, 2};
  auto replica = make_cpu_replica(device_, 2);
  replica->write_params(params);
  replica->set_input(batch);
  replica->forward(true, key, 2);
  replica->backward([](int) {});
  std::vector<float> grads(kParamCount);
  ReplicaTesting::read_grads(*replica, grads);

  auto p = to_double(params);
  const auto samples = ref_samples(batch);
  std::vector<std::vector<double>> features;
  for (const auto& s : samples) features.push_back(ref_features(p, s, &key));
  std::mt19937 rng(4);
  constexpr double kH = 1e-6;
  for (std::size_t pi = 0; pi < kParams.size(); ++pi) {
    const ParamInfo& info = kParams[pi];
    const bool conv = pi < 4;
    std::vector<std::size_t> order(info.count);
    std::iota(order.begin(), order.end(), info.offset);
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return std::abs(grads[a]) > std::abs(grads[b]); });
    const double largest = std::abs(grads[order[0]]);
    ASSERT_GT(largest, 0) << info.name;
    std::vector<std::size_t> picks{order[0], order[1], order[info.count / 50], order[info.count / 5]};
    for (int r = 0; r < 2; ++r) picks.push_back(info.offset + rng() % info.count);
    for (std::size_t i : picks) {
      const double saved = p[i];
      p[i] = saved + kH;
      const double up = ref_loss(p, samples, &key, conv ? nullptr : &features);
      p[i] = saved - kH;
      const double down = ref_loss(p, samples, &key, conv ? nullptr : &features);
      p[i] = saved;
      const double fd = (up - down) / (2 * kH);
      EXPECT_NEAR(grads[i], fd, 1e-4 * std::abs(fd) + 1e-5 * largest)
          << info.name << "[" << i - info.offset << "], largest " << largest;
    }
  }
}

// ---- The contract with the trainer. ----

// grads_ready(l) comes on the calling thread in the order fc2, fc1, conv2, conv1, and work
// it queues on the comm stream behind comm_wait_compute() sees that layer's final
// gradients: what lets the allreduce of fc2/fc1 overlap the conv backward.
TEST_F(ReplicaTest, GradsReadyInOrderAndVisibleToTheCommStream) {
  auto replica = make_cpu_replica(device_, 4);
  replica->write_params(initial_parameters(3));
  const DropoutKey key{1, 0};
  std::vector<float> before(kParamCount), after(kParamCount);
  replica->set_input(random_batch(4, 1));
  replica->forward(true, key, 4);
  replica->backward([](int) {});
  ReplicaTesting::read_grads(*replica, before);

  replica->set_input(random_batch(4, 2));
  replica->forward(true, key, 4);
  std::vector<int> order;
  std::vector<std::vector<float>> seen(kLayers);
  const auto caller = std::this_thread::get_id();
  replica->backward([&](int layer) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(layer);
    device_.comm_wait_compute();
    const Range r = layer_range(layer);
    device_.comm().enqueue([&seen, layer, r, g = replica->grads()] { seen[layer].assign(g + r.offset, g + r.offset + r.count); });
  });
  device_.synchronize();
  ReplicaTesting::read_grads(*replica, after);
  EXPECT_EQ(order, (std::vector<int>{kFc2, kFc1, kConv2, kConv1}));
  for (int layer = 0; layer < kLayers; ++layer) {
    const Range r = layer_range(layer);
    const std::vector<float> want(after.begin() + r.offset, after.begin() + r.offset + r.count);
    EXPECT_EQ(seen[layer], want) << "layer " << layer;
    EXPECT_NE(std::vector<float>(before.begin() + r.offset, before.begin() + r.offset + r.count), want) << layer;
  }
}

// set_input, forward, backward (callbacks included) and sgd_step only enqueue: they return
// while the compute stream is still held up by earlier work.
TEST_F(ReplicaTest, StepCallsReturnWithoutWaitingForTheDevice) {
  auto replica = make_cpu_replica(device_, 2);
  replica->write_params(initial_parameters(9));
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> released_flag{false};
  device_.compute().enqueue([released] { released.wait(); });
  std::thread watchdog([&] {  // frees the stream anyway, so a blocking call fails instead of hanging
    if (released.wait_for(std::chrono::seconds(20)) == std::future_status::timeout && !released_flag.exchange(true))
      release.set_value();
  });
  std::vector<int> order;
  replica->set_input(random_batch(2, 4));
  replica->forward(true, {3, 1}, 2);
  replica->backward([&](int layer) { order.push_back(layer); });
  replica->update({0.01f, 0.9f, 0.0f});
  const bool returned_while_held = !released_flag.exchange(true);
  if (returned_while_held) release.set_value();
  device_.synchronize();
  watchdog.join();
  EXPECT_TRUE(returned_while_held);
  EXPECT_EQ(order, (std::vector<int>{kFc2, kFc1, kConv2, kConv1}));
}

// --exchange factors: fc1's gradients formed from gathered factors. Against fc1's backward
// over the same rows (oneDNN's product: within rounding) and a float64 G^T X; the same bits
// whatever the world (a replica of a world of 2 given 8 rows, each rank's G twice the
// 8-row batch's, forms 1 x 8's); the norm from the factors alone agrees with the written
// gradient's, and the update that takes the product chunk by chunk writes the bits of an
// update from the whole written gradient.
TEST_F(ReplicaTest, Fc1GradientsFromFactors) {
  const auto params = initial_parameters(6);
  const DropoutKey key{3, 0};
  const Batch batch = random_batch(8, 11);
  const Range fc1 = layer_range(kFc1);
  const auto read_all = [](Replica& r) {
    std::vector<float> g(kParamCount);
    ReplicaTesting::read_grads(r, g);
    return g;
  };
  const auto fc1_of = [&](const std::vector<float>& g) {
    return std::vector<float>(g.begin() + static_cast<std::ptrdiff_t>(fc1.offset),
                              g.begin() + static_cast<std::ptrdiff_t>(fc1.offset + fc1.count));
  };
  auto plain = make_cpu_replica(device_, 8);
  plain->write_params(params);
  plain->set_input(batch);
  plain->forward(true, key, 8);
  plain->backward([](int) {});
  const std::vector<float> backward = fc1_of(read_all(*plain));

  auto one = make_cpu_replica(device_, 8);  // a world of 1: its own factors
  one->exchange_factors(1);
  one->prepare(std::vector<std::uint32_t>{8});
  one->write_params(params);
  one->set_input(batch);
  one->forward(true, key, 8);
  int reported = 0;
  one->backward([&](int layer) { reported += layer == kFc1; });
  EXPECT_EQ(reported, 1);  // fc1 still reported, for the allgather of G
  one->grad_norm();        // the device done with the step: its factors are readable
  const Replica::Factors f = one->factors();
  ASSERT_NE(f.input, nullptr);
  std::copy_n(f.input, 8 * kFlat, f.all_inputs);
  std::copy_n(f.output_grad, 8 * kHidden, f.all_output_grads);
  std::vector<double> reference(fc1.count, 0.0);  // G^T X, then G's column sums (the bias)
  for (std::size_t r = 0; r < 8; ++r)
    for (std::size_t i = 0; i < kHidden; ++i) {
      const double g = f.output_grad[r * kHidden + i];
      for (std::size_t j = 0; j < kFlat; ++j) reference[i * kFlat + j] += g * f.input[r * kFlat + j];
      reference[kHidden * kFlat + i] += g;
    }
  one->grads_from_factors(8);
  const double norm = one->grad_norm();  // from the factors: fc1's weight gradient not yet written
  const std::vector<float> all = read_all(*one);
  const std::vector<float> formed = fc1_of(all);
  double squares = 0, error = 0, size = 0;
  for (float v : all) squares += double{v} * v;
  for (std::size_t k = 0; k < formed.size(); ++k) {
    error = std::max(error, std::abs(formed[k] - reference[k]));
    size = std::max(size, std::abs(reference[k]));
  }
  EXPECT_LE(error, 1e-6 * size);
  double apart = 0, backward_size = 0;  // normwise, against oneDNN's product
  for (std::size_t k = 0; k < formed.size(); ++k) {
    apart += (double{formed[k]} - backward[k]) * (double{formed[k]} - backward[k]);
    backward_size += double{backward[k]} * backward[k];
  }
  EXPECT_LE(std::sqrt(apart), 1e-6 * std::sqrt(backward_size));
  EXPECT_NEAR(norm, std::sqrt(squares), 1e-6 * norm);

  auto half = make_cpu_replica(device_, 4);  // a rank of 2 x 4, given both ranks' factors
  half->exchange_factors(2);
  const Replica::Factors h = half->factors();
  std::copy_n(f.input, 8 * kFlat, h.all_inputs);
  for (std::size_t i = 0; i < 8 * kHidden; ++i) h.all_output_grads[i] = 2.0f * f.output_grad[i];
  half->write_params(params);
  half->grads_from_factors(8);
  OptimizerOptions sgd;
  sgd.momentum = 0.9;
  half->update(sgd);  // fc1's weight gradient made chunk by chunk for the update
  one->update(sgd);   // from the gradient read_all wrote whole
  std::vector<float> after_half(kParamCount), after_one(kParamCount);
  half->read_params(after_half);
  one->read_params(after_one);
  EXPECT_EQ(fc1_of(after_half), fc1_of(after_one));
  EXPECT_NE(fc1_of(after_one), fc1_of(params));
  EXPECT_EQ(fc1_of(read_all(*half)), formed);  // and the written gradient is 1 x 8's too
  EXPECT_THROW(half->grads_from_factors(9), RuntimeFailure);  // more rows than 2 x 4

  // Over 16 rows the product is written whole when taken, and the norm is the written
  // gradient's (to the rounding of a sum of exact squares, not the factors' 1e-7): a world
  // of 8 given the 8 rows 8 times, each G times 8, forms 8 times the 8 rows' gradient.
  auto wide = make_cpu_replica(device_, 8);
  wide->exchange_factors(8);
  const Replica::Factors w = wide->factors();
  for (std::size_t copy = 0; copy < 8; ++copy) {
    std::copy_n(f.input, 8 * kFlat, w.all_inputs + copy * 8 * kFlat);
    for (std::size_t i = 0; i < 8 * kHidden; ++i) w.all_output_grads[copy * 8 * kHidden + i] = 8.0f * f.output_grad[i];
  }
  wide->grads_from_factors(64);
  const double wide_norm = wide->grad_norm();
  const std::vector<float> wide_all = read_all(*wide);
  double wide_squares = 0, wide_apart = 0, wide_size = 0;  // normwise, against 8 x float64
  for (float v : wide_all) wide_squares += double{v} * v;
  for (std::size_t k = 0; k < fc1.count; ++k) {
    const double d = wide_all[fc1.offset + k] - 8.0 * reference[k];
    wide_apart += d * d;
    wide_size += 64.0 * reference[k] * reference[k];
  }
  EXPECT_LE(std::sqrt(wide_apart), 1e-6 * std::sqrt(wide_size));
  EXPECT_NEAR(wide_norm, std::sqrt(wide_squares), 1e-12 * wide_norm);
}

// Gradients are overwritten by each backward, never accumulated.
TEST_F(ReplicaTest, BackwardOverwritesGradients) {
  const auto params = initial_parameters(4);
  const DropoutKey key{2, 1};
  auto grads_after = [&](const std::vector<Batch>& batches) {
    auto replica = make_cpu_replica(device_, 4);
    replica->write_params(params);
    for (const Batch& b : batches) {
      replica->set_input(b);
      replica->forward(true, key, 4);
      replica->backward([](int) {});
    }
    std::vector<float> g(kParamCount);
    ReplicaTesting::read_grads(*replica, g);
    return g;
  };
  EXPECT_EQ(grads_after({random_batch(4, 7), random_batch(4, 8)}), grads_after({random_batch(4, 8)}));
}

// A smaller batch (the last one of an evaluation) gets its own primitives; each sample's
// outputs do not depend on the batch it came in, dropout included (docs/architecture.md decision 9).
TEST_F(ReplicaTest, SmallerBatchesGiveTheSameSamples) {
  auto replica = make_cpu_replica(device_, 6);
  replica->write_params(initial_parameters(5));
  const Batch all = random_batch(6, 3, 1000);
  const DropoutKey key{9, 3};
  const auto full = logprobs(*replica, all, true, key);
  Batch tail = all;
  tail.size = 2;
  tail.images.assign(all.images.begin() + 4 * kImageBytes, all.images.end());
  tail.labels.assign(all.labels.begin() + 4, all.labels.end());
  tail.indices.assign(all.indices.begin() + 4, all.indices.end());
  const auto part = logprobs(*replica, tail, true, key);
  for (std::size_t i = 0; i < part.size(); ++i)
    EXPECT_NEAR(part[i], full[4 * kClasses + i], 1e-6 * std::abs(full[4 * kClasses + i])) << i;
  EXPECT_EQ(logprobs(*replica, all, true, key), full);
  const Batch too_big = random_batch(7, 1);
  EXPECT_THROW(replica->set_input(too_big), RuntimeFailure);
}

// --mode dp's pieces: forward_logits() and the loss in chunks of rows train what
// forward() does, bit for bit; rows written into input() with set_scattered_input()
// give the logits that set_input() of those images gives, and use_rows() takes the first
// rows, both to rounding: a GEMM of fewer rows may block, and so round, differently
// (seen at AVX2).
TEST_F(ReplicaTest, ASplitForwardAndAScatteredInputTrainWhatForwardDoes) {
  const Batch all = random_batch(6, 21, 500);
  const DropoutKey key{4, 2};
  const auto grads_of = [](Replica& r) {
    std::vector<float> g(kParamCount);
    ReplicaTesting::read_grads(r, g);
    return g;
  };
  auto whole = make_cpu_replica(device_, 6);
  whole->write_params(initial_parameters(8));
  whole->set_input(all);
  whole->forward(true, key, 6);
  whole->backward([](int) {});
  const StepStats whole_stats = whole->take_stats();

  auto split = make_cpu_replica(device_, 6);
  split->write_params(initial_parameters(8));
  split->set_input(all);
  split->forward_logits(true, key);
  split->loss(0, 4, 6);
  split->loss(4, 2, 6);
  split->backward([](int) {});
  const StepStats split_stats = split->take_stats();
  EXPECT_EQ(grads_of(*split), grads_of(*whole));
  EXPECT_EQ(split_stats.samples, 6);
  EXPECT_EQ(split_stats.correct, whole_stats.correct);
  EXPECT_NEAR(split_stats.loss_sum, whole_stats.loss_sum, 1e-6 * whole_stats.loss_sum);
  EXPECT_THROW(split->loss(4, 3, 6), RuntimeFailure);  // past the labelled rows

  // Rows 4 and 5, as a scatter would leave them on another device.
  auto chunk = make_cpu_replica(device_, 2);
  chunk->write_params(initial_parameters(8));
  device_.synchronize();
  std::copy_n(split->input() + 4 * kImageBytes, 2 * kImageBytes, chunk->input());
  chunk->set_scattered_input(std::span<const std::uint32_t>(all.indices.data() + 4, 2));
  chunk->forward_logits(true, key);
  device_.synchronize();
  expect_close(std::vector<float>(chunk->logits(), chunk->logits() + 2 * kClasses),
               std::vector<float>(split->logits() + 4 * kClasses, split->logits() + 6 * kClasses), "scattered rows");
  EXPECT_THROW(chunk->loss(0, 1, 2), RuntimeFailure);  // a scattered input has no labels

  // The first four rows alone.
  split->use_rows(4);
  split->forward_logits(true, key);
  device_.synchronize();
  std::vector<float> first_four(split->logits(), split->logits() + 4 * kClasses);
  Batch head = all;
  head.size = 4;
  auto four = make_cpu_replica(device_, 4);
  four->write_params(initial_parameters(8));
  four->set_input(head);
  four->forward_logits(true, key);
  device_.synchronize();
  expect_close(first_four, std::vector<float>(four->logits(), four->logits() + 4 * kClasses), "first rows");
  EXPECT_THROW(split->use_rows(7), RuntimeFailure);
}

// take_stats sums NLL, correct argmaxes and samples over the forwards since the last call.
TEST_F(ReplicaTest, StatsSumOverForwards) {
  auto replica = make_cpu_replica(device_, 5);
  replica->write_params(initial_parameters(6));
  double loss = 0, correct = 0;
  for (std::uint32_t seed : {1u, 2u}) {
    const Batch b = random_batch(5, seed);
    const auto lp = logprobs(*replica, b, false, {});
    for (std::uint32_t n = 0; n < 5; ++n) {
      const auto row = lp.begin() + n * kClasses;
      loss -= row[b.labels[n]];
      correct += std::max_element(row, row + kClasses) - row == b.labels[n];
      EXPECT_NEAR(std::accumulate(row, row + kClasses, 0.0, [](double a, float v) { return a + std::exp(v); }), 1.0, 1e-5);
    }
  }
  const StepStats stats = replica->take_stats();
  EXPECT_EQ(stats.samples, 10);
  EXPECT_NEAR(stats.loss_sum, loss, 1e-5 * loss);
  EXPECT_EQ(stats.correct, correct);
  EXPECT_EQ(replica->take_stats().samples, 0);
}

// guarded_sgd_step: a finite step is sgd_step's, bit for bit; a non-finite one leaves the
// parameters, momentum and stats as they were and is counted; with halt, so is every
// later one. The norm comes from the reduced sum of squares when one is given. A dropped
// update is recorded as the guard's first step plus the replica's guarded updates before it.
TEST_F(ReplicaTest, AGuardedUpdateIsDroppedOnTheDeviceWhenNonFinite) {
  constexpr std::uint64_t kFirst = 40;
  const auto params = initial_parameters(12);
  const OptimizerOptions sgd{0.01f, 0.9f, 0.0f};
  const DropoutKey key{4, 0};
  auto replica = [&] {
    auto r = make_cpu_replica(device_, 3);
    r->write_params(params);
    return r;
  };
  auto train = [&](Replica& r, std::uint32_t seed) {
    r.set_input(random_batch(3, seed));
    r.forward(true, key, 3);
    r.backward([](int) {});
  };
  auto read = [](Replica& r) {
    std::vector<float> p(kParamCount);
    r.read_params(p);
    return p;
  };
  const auto nothing = [] { return std::optional<double>(); };
  const auto nan = [] { return std::optional<double>(std::nan("")); };

  auto plain = replica();
  auto guarded = replica();
  for (std::uint32_t step = 0; step < 2; ++step) {
    train(*plain, step);
    plain->update(sgd);
    train(*guarded, step);
    guarded->guarded_update(sgd, {kFirst, true, nothing});
  }
  EXPECT_EQ(read(*guarded), read(*plain));
  const StepStats applied = guarded->take_stats();
  EXPECT_EQ(applied.samples, 6);
  EXPECT_EQ(applied.skipped, 0u);
  EXPECT_FALSE(applied.non_finite);

  // A NaN reduced norm (skip: no halt): dropped, then the next step applies.
  const auto before = read(*guarded);
  train(*guarded, 5);
  guarded->guarded_update(sgd, {kFirst, false, nan});  // update 2
  EXPECT_EQ(read(*guarded), before);
  const StepStats dropped = guarded->take_stats();
  EXPECT_EQ(dropped.samples, 0);
  EXPECT_EQ(dropped.skipped, 1u);
  ASSERT_TRUE(dropped.non_finite);
  EXPECT_EQ(dropped.non_finite->step, kFirst + 2);
  EXPECT_TRUE(std::isnan(dropped.non_finite->grad_norm));
  EXPECT_TRUE(std::isfinite(dropped.non_finite->loss_sum));
  train(*guarded, 6);
  guarded->guarded_update(sgd, {kFirst, true, nothing});
  EXPECT_NE(read(*guarded), before);
  EXPECT_EQ(guarded->take_stats().skipped, 0u);

  // A NaN parameter: NaN loss and gradients, found by the replica's own sum. It halts.
  auto poisoned = read(*guarded);
  const auto good = poisoned;
  poisoned.back() = std::nanf("");
  guarded->write_params(poisoned);
  train(*guarded, 9);
  guarded->guarded_update(sgd, {kFirst, true, nothing});  // update 4
  guarded->write_params(good);
  train(*guarded, 10);
  guarded->guarded_update(sgd, {kFirst, true, nothing});
  EXPECT_EQ(read(*guarded), good) << "a halted replica applies nothing";
  const StepStats halted = guarded->take_stats();
  EXPECT_EQ(halted.skipped, 2u);
  ASSERT_TRUE(halted.non_finite);
  EXPECT_EQ(halted.non_finite->step, kFirst + 4);
  EXPECT_TRUE(std::isnan(halted.non_finite->loss_sum));
}

// Snapshots are taken without waiting and read once made; each holds the stats since the
// one before.
TEST_F(ReplicaTest, StatsSnapshotsAreTakenWithoutWaitingAndReadOnceMade) {
  auto replica = make_cpu_replica(device_, 2);
  replica->write_params(initial_parameters(13));
  replica->set_input(random_batch(2, 1));
  replica->forward(false, {}, 2);
  std::atomic<bool> release{false};
  device_.compute().enqueue([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  const std::uint64_t first = replica->snapshot_stats();
  EXPECT_FALSE(replica->read_stats(first, false).has_value());
  release = true;
  replica->set_input(random_batch(2, 2));
  replica->forward(false, {}, 2);
  replica->forward(false, {}, 2);
  const std::uint64_t second = replica->snapshot_stats();
  EXPECT_EQ(replica->read_stats(second, true)->samples, 4);
  EXPECT_EQ(replica->read_stats(first, false)->samples, 2);
  for (std::uint64_t k = 0; k < Replica::kSnapshots; ++k) replica->snapshot_stats();
  EXPECT_THROW(replica->read_stats(second, true), RuntimeFailure) << "overwritten";
  EXPECT_THROW(replica->read_stats(second + 100, true), RuntimeFailure) << "never taken";
}

// set_input copies the batch: the caller may refill its buffers at once.
TEST_F(ReplicaTest, SetInputCopiesTheBatch) {
  auto replica = make_cpu_replica(device_, 3);
  replica->write_params(initial_parameters(7));
  const Batch b = random_batch(3, 11);
  const auto want = logprobs(*replica, b, true, {5, 5});
  Batch reused = b;
  replica->set_input(reused);
  std::fill(reused.images.begin(), reused.images.end(), 0);
  std::fill(reused.labels.begin(), reused.labels.end(), 0);
  std::fill(reused.indices.begin(), reused.indices.end(), 0);
  replica->forward(true, {5, 5}, 3);
  std::vector<float> got(3 * kClasses);
  replica->read_logprobs(got);
  EXPECT_EQ(got, want);
}

// A loaded momentum buffer is continued (buf = m*buf + g), not restarted (buf = g).
TEST_F(ReplicaTest, SgdContinuesWrittenMomentum) {
  auto replica = make_cpu_replica(device_, 2);
  const auto params = initial_parameters(8);
  replica->write_params(params);
  std::vector<float> zeros(kParamCount), m0(kParamCount);
  const OptimizerState fresh = replica->read_state();
  EXPECT_EQ(fresh.first, zeros);
  EXPECT_EQ(fresh.second, zeros);
  EXPECT_EQ(fresh.applied, 0u);
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0, 0.01f);
  for (float& v : m0) v = dist(rng);
  replica->write_state({m0, {}, 5});
  replica->set_input(random_batch(2, 3));
  replica->forward(true, {}, 2);
  replica->backward([](int) {});
  const OptimizerOptions sgd{0.05f, 0.8f, 0.01f};
  replica->update(sgd);
  std::vector<float> g(kParamCount), p(kParamCount);
  ReplicaTesting::read_grads(*replica, g);
  replica->read_params(p);
  const OptimizerState state = replica->read_state();
  EXPECT_EQ(state.applied, 6u);
  for (std::size_t i = 0; i < kParamCount; i += 101) {
    const float buf = float(sgd.momentum) * m0[i] + (g[i] + float(sgd.weight_decay) * params[i]);
    ASSERT_NEAR(state.first[i], buf, 1e-6f * (std::abs(buf) + 1e-3f)) << i;
    ASSERT_NEAR(p[i], params[i] - float(sgd.lr) * buf, 1e-7f) << i;
  }
}

}  // namespace
}  // namespace mnist_mt::cpu
