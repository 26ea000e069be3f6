#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011):
// a counter-based generator, so any element's random number is a pure function of
// its key and counter. Shared by the CPU and CUDA backends so both draw the same
// dropout masks and initial weights bit for bit.
#include <array>
#include <cstdint>

#include "mnist_mt/host_device.hpp"

namespace mnist_mt {

struct Philox4 {
  std::uint32_t v[4];
};

MNIST_MT_HD Philox4 philox4x32_10(Philox4 ctr, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * ctr.v[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * ctr.v[2];
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// Uniform float in [0, 1) from the top 24 bits: exact in fp32 on every device.
MNIST_MT_HD float uniform01(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Streams of random numbers; the value is the third word of the counter, so the
// streams never overlap.
enum class RandomStream : std::uint32_t { kInit = 0x1A17u, kDropout0 = 0xD0u, kDropout1 = 0xD1u };

// Dropout keep decision for element `element` of sample `sample` (global index in the
// training set) in dropout layer `stream`, epoch `epoch`: docs/architecture.md decision 9. Never
// depends on the rank, so N ranks x batch B draw the masks of 1 rank x batch N*B.
MNIST_MT_HD bool dropout_keep(std::uint64_t seed, std::uint32_t epoch, std::uint32_t sample,
                              RandomStream stream, std::uint32_t element, float p) {
  const Philox4 r = philox4x32_10(
      Philox4{{element >> 2, sample, static_cast<std::uint32_t>(stream), epoch}},
      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  return uniform01(r.v[element & 3u]) >= p;
}

}  // namespace mnist_mt
