#pragma once
// What the trainer tests of both backends share: a data set of noise, a configuration
// that trains it for a few steps on CPU devices, and the distance between two sets of
// parameters.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/trainer.hpp"

namespace mnist_mt::testing_fixture {

// Uniform noise. Plain regions (a blank background, a bright square) make near-ties in
// max-pool that rounding decides, which the comparisons would measure instead of the
// trainer.
inline Split noise_split(std::uint32_t n, unsigned seed) {
  std::mt19937 rng(seed);
  Split s;
  s.images.resize(std::size_t{n} * kImageBytes);
  s.labels.resize(n);
  for (auto& label : s.labels) label = static_cast<std::uint8_t>(rng() % kClasses);
  for (auto& pixel : s.images) pixel = static_cast<std::uint8_t>(rng());
  return s;
}

inline const Dataset& dataset() {
  static const Dataset data{noise_split(640, 1), noise_split(101, 2)};
  return data;
}

// A small learning rate and no momentum: in fp32 a rounding difference can flip a ReLU
// whose input is within rounding of zero, which changes that sample's gradient outright,
// and a large step would carry such a flip past the 1e-5 that the comparisons allow.
inline constexpr std::uint64_t kSeed = 7;  // config_for's
inline TrainConfig config_for(int world, std::uint32_t batch) {
  TrainConfig c;
  for (int r = 0; r < world; ++r) c.devices.push_back(r);
  c.batch = batch;
  c.epochs = 1;
  c.max_steps = 20;
  c.seed = kSeed;
  c.optimizer = {0.001f, 0.0f, 1e-4f};
  c.evaluate = false;
  return c;
}

// Trains `config` on dataset() with the CPU backend.
inline TrainResult run(const TrainConfig& config) {
  auto backend = make_cpu_backend({});
  return train(*backend, dataset(), config);
}

// The parameters a run of config_for starts from.
inline std::vector<float> initial_params() { return initial_parameters(kSeed); }

// The worst over the parameter tensors of |a - b| / |b| (Euclidean norms). Norms, not
// elements: rounding differences may flip a max-pool choice between near-equal inputs,
// which moves a few single weights by more while the tensor stays as close.
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (const ParamInfo& p : kParams) {
    double diff = 0, norm = 0;
    for (std::size_t i = p.offset; i < p.offset + p.count; ++i) {
      diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
      norm += double{b[i]} * b[i];
    }
    worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

}  // namespace mnist_mt::testing_fixture
