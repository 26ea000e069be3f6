#pragma once
// The CPU replica's plans: one a batch size, and with --exchange factors fc1's products
// over the gathered factors, one a row count (Replica::exchange_factors). Built on the
// device's compute thread, since oneDNN picks its kernels for the thread count of the
// thread that creates them; their errors name the device.
#include <cstdint>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "device.hpp"
#include "fc.hpp"
#include "isa.hpp"
#include "plan.hpp"

namespace mnist_mt::cpu {

class PlanCache {
 public:
  // `engine` is the replica's, made on the compute thread (read when a plan is built).
  PlanCache(CpuDevice& device, const dnnl::engine& engine, Isa isa, const Buffers& buffers, float* params,
            float* grads)
      : device_(device), engine_(engine), isa_(isa), buffers_(buffers), params_(params), grads_(grads) {}

  // The plan for a batch of `n`, built (waiting for the compute thread) on first use.
  Plan& batch(std::uint32_t n);

  // Holds every rank's fc1 factors from now on: `world` x max_batch rows (replacing any).
  void exchange_factors(int world);
  Fc1Factors* factors() { return factors_ ? &*factors_ : nullptr; }
  // fc1's product over `rows` rows of the gathered factors, built on first use.
  Plan& factor_product(std::uint32_t rows);

  // Compute thread: drops every plan (oneDNN's objects die on the thread that made them).
  void clear();

 private:
  template <typename Make>
  Plan& built(const std::string& what, Make make);

  CpuDevice& device_;
  const dnnl::engine& engine_;
  const Isa isa_;
  const Buffers& buffers_;
  float* const params_;
  float* const grads_;
  std::map<std::uint32_t, std::unique_ptr<Plan>> plans_;
  std::optional<Fc1Factors> factors_;
};

}  // namespace mnist_mt::cpu
