#pragma once
// --exchange (TrainConfig::exchange): whether a DDP run exchanges fc1's factors instead of
// allreducing its gradient, and the bytes each rank sends per step.
#include <array>
#include <cstdint>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/processes.hpp"
#include "mnist_mt/trainer.hpp"

namespace mnist_mt {

// Floats of fc1's factors a rank sends per sample: the gradient at its output and its input.
inline constexpr std::size_t kFactorWidth = kHidden + kFlat;

// Whether the run exchanges fc1's factors: TrainConfig::exchange resolved for the run's
// world, batch and devices, where `shards` is the world's shards (more than its ranks
// when a resumed run computes several a rank). Throws InputError ("exchange") where
// factors are asked for and cannot run.
bool exchanges_factors(const TrainConfig& config, const Place& place, std::uint32_t shards, const Backend& backend);

// kAuto's rule, for a run that can exchange either way (exchange.cpp says why).
bool factors_pay(std::uint32_t batch, const Place& place);

// EpochMetrics::bytes_sent_per_step of a step of `batch` images a rank among `world`.
std::array<double, kLayers> bytes_sent_per_step(bool factors, std::uint32_t batch, int world);

}  // namespace mnist_mt
