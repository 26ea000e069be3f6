#pragma once
// What the CPU communicator tests share: CPU devices with their communicators, float
// buffers whose order of additions shows in the bits, and a bitwise comparison.
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cpu/device.hpp"
#include "mnist_mt/communicator.hpp"

namespace float_buffers {

// Values of very different magnitudes, so that the order of additions shows in the bits.
inline std::vector<std::vector<float>> random_buffers(int world, std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<std::vector<float>> buffers(static_cast<std::size_t>(world), std::vector<float>(count));
  for (auto& b : buffers) {
    for (float& x : b) x = std::ldexp(mantissa(rng), exponent(rng));
  }
  return buffers;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Devices and their communicators, in rank order; never leaves a stream blocked when a
// test fails midway.
struct Ranks {
  Ranks() = default;
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;
  ~Ranks() {
    for (auto& c : comms) c->abort();
    for (auto& d : devices) {
      try {
        d->synchronize();
      } catch (...) {
      }
    }
  }
  void synchronize() {
    for (auto& d : devices) d->synchronize();
  }
  std::vector<std::unique_ptr<mnist_mt::cpu::CpuDevice>> devices;
  std::vector<std::unique_ptr<mnist_mt::Communicator>> comms;
};

}  // namespace float_buffers
