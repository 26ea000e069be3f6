#pragma once
// conv2's forward (32 -> 64 channels, 3x3, on 26x26; bias, no ReLU: the pooling applies
// it): oneDNN's Winograd F(4x4, 3x3) where oneDNN's convolution_auto takes it (AVX-512,
// from 9 images on a compute thread's one OpenMP thread), elsewhere on AVX2 and AVX-512
// our Winograd F(2x2, 3x3) (conv2_winograd_f2.hpp), which measured faster than oneDNN's
// direct convolution, and on SSE2 oneDNN's direct convolution. Its backward is
// conv2_backward.cpp.
#include <cstdint>
#include <dnnl.hpp>
#include <string>
#include <vector>

#include "aligned.hpp"
#include "conv2_winograd_f2.hpp"
#include "isa.hpp"
#include "step.hpp"

namespace mnist_mt::cpu {

class PlanBuilder;
struct Plan;
struct Buffers;

// Adds conv2's forward to `plan`: oneDNN's convolution with the reorder of its weights
// into oneDNN's layout where oneDNN takes its Winograd for the plan's batch (AVX-512) or
// the ISA is SSE2, else Conv2WinogradForward.
void add_conv2_forward(PlanBuilder& b, Plan& plan, const Buffers& buf, Isa isa, float* params);

class Conv2WinogradForward {
 public:
  // For batches of exactly `batch` images; primitives made on the calling thread.
  Conv2WinogradForward(const dnnl::engine& engine, std::uint32_t batch, Isa isa);
  Conv2WinogradForward(const Conv2WinogradForward&) = delete;
  Conv2WinogradForward& operator=(const Conv2WinogradForward&) = delete;

  // "own:<isa> winograd 2x3 + matmul <oneDNN's implementation>"
  const std::string& impl() const { return impl_; }

  // a2 (batch x 64/B x 24 x 24 x B) = w * a1 + bias, from a1 (batch x 32/B x 26 x 26 x B)
  // and the state dict's weights and bias.
  void forward(const dnnl::stream& stream, const float* a1, const float* w, const float* bias, float* a2);

 private:
  WinogradF2Kernels kernels_;
  std::uint32_t batch_, chunk_;      // images per chunk: the largest divisor of batch_ up to a cap
  std::size_t plane_v_, plane_m_;    // floats between positions in v_ and m_
  Aligned<float> u_, v_, m_;         // transformed weights; one chunk's tiles in and out
  std::vector<dnnl::memory> memories_;
  Step product_;                     // M = V U, per position
  std::string impl_;
};

}  // namespace mnist_mt::cpu
