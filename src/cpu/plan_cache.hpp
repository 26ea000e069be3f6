#pragma once
// The CPU replica's plans, one a batch size. Built on the device's compute thread, since
// oneDNN picks its kernels for the thread count of the thread that creates them; their
// errors name the device.
#include <cstdint>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <string>

#include "device.hpp"
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

  // Compute thread: drops every plan (oneDNN's objects die on the thread that made them).
  void clear() { plans_.clear(); }

 private:
  CpuDevice& device_;
  const dnnl::engine& engine_;
  const Isa isa_;
  const Buffers& buffers_;
  float* const params_;
  float* const grads_;
  std::map<std::uint32_t, std::unique_ptr<Plan>> plans_;
};

}  // namespace mnist_mt::cpu
