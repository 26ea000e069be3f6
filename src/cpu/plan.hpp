#pragma once
// The CPU replica's plan for one batch size: oneDNN's primitives bound to the replica's
// buffers (conv2's forward, fc1, fc2, where oneDNN runs them), conv2's Winograd forward
// (where ours) and backward, and the name of what runs each operation of the step. Built
// on the device's compute thread (replica.cpp).
#include <array>
#include <cstdint>
#include <dnnl.hpp>
#include <memory>
#include <string>
#include <vector>

#include "aligned.hpp"
#include "conv2_backward.hpp"
#include "conv2_forward.hpp"
#include "isa.hpp"
#include "kernels.hpp"
#include "step.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cpu {

// Activation buffers, sized for max_batch and shared by the plans of every batch size.
// With `bf16` (--precision bf16), also the bfloat16 copies that fc1's and fc2's products
// read: their inputs, output gradients and weights, rounded to nearest even.
struct Buffers {
  // A sample's floats in conv1's output (and its gradient) and in conv2's.
  static constexpr std::size_t kAct1 = kConv1Channels * kConv1Side * kConv1Side;
  static constexpr std::size_t kAct2 = kConv2Channels * kConv2Side * kConv2Side;

  Buffers(std::size_t b, bool bf16)
      : max_batch(b),
        input(aligned_zeros<float>(b * kImageBytes)),
        act1(aligned_zeros<float>(b * kAct1)),
        d_act1(aligned_zeros<float>(b * kAct1)),
        act2(aligned_zeros<float>(b * kAct2)),
        argmax(aligned_zeros<std::uint8_t>(b * kFlat)),
        flat(aligned_zeros<float>(b * kFlat)),
        d_flat(aligned_zeros<float>(b * kFlat)),
        hidden(aligned_zeros<float>(b * kHidden)),
        d_hidden(aligned_zeros<float>(b * kHidden)),
        d_hidden_t(aligned_zeros<float>(kHidden * fc1_transposed_stride(static_cast<std::uint32_t>(b)))),
        logits(aligned_zeros<float>(b * kClasses)),
        logp(aligned_zeros<float>(b * kClasses)),
        dlogits(aligned_zeros<float>(b * kClasses)),
        labels(aligned_zeros<std::uint8_t>(b)),
        samples(aligned_zeros<std::uint32_t>(b)),
        flat16(bf16 ? aligned_zeros<std::uint16_t>(b * kFlat) : nullptr),
        hidden16(bf16 ? aligned_zeros<std::uint16_t>(b * kHidden) : nullptr),
        d_hidden16(bf16 ? aligned_zeros<std::uint16_t>(b * kHidden) : nullptr),
        dlogits16(bf16 ? aligned_zeros<std::uint16_t>(b * kClasses) : nullptr),
        fc1_weights16(bf16 ? aligned_zeros<std::uint16_t>(kParams[4].count) : nullptr),
        fc2_weights16(bf16 ? aligned_zeros<std::uint16_t>(kParams[6].count) : nullptr) {}

  bool bf16() const { return flat16 != nullptr; }

  // The bytes the buffers above take per sample of max_batch (d_hidden_t at its
  // unpadded size; the bf16 weights do not grow with it): what a batch costs in memory.
  static constexpr std::uint64_t bytes_per_sample(bool bf16) {
    const std::uint64_t floats = kImageBytes + 2 * kAct1 + kAct2 + 2 * kFlat + 3 * kHidden + 3 * kClasses;
    const std::uint64_t halves = bf16 ? kFlat + 2 * kHidden + kClasses : 0;
    return 4 * floats + 2 * halves + kFlat /* argmax */ + 1 /* label */ + 4 /* sample */;
  }

  std::size_t max_batch;
  Aligned<float> input, act1, d_act1, act2;  // no d_act2: conv2's backward reads d_flat and argmax
  Aligned<std::uint8_t> argmax;  // the pooling's, one byte an output
  Aligned<float> flat, d_flat, hidden, d_hidden, d_hidden_t, logits, logp, dlogits;  // d_hidden_t: G^T (fc.hpp)
  Aligned<std::uint8_t> labels;
  Aligned<std::uint32_t> samples;
  Aligned<std::uint16_t> flat16, hidden16, d_hidden16, dlogits16, fc1_weights16, fc2_weights16;  // bf16() only
};

// Every primitive for one batch size, bound to the replica's buffers.
struct Plan {
  std::uint32_t batch = 0;
  std::vector<dnnl::memory> memories;  // keeps the memory objects behind Step::args alive
  std::vector<Aligned<float>> owned;   // conv2's weights in oneDNN's layout
  std::vector<Step> weights_to_forward;  // conv2's weights: state-dict layout -> forward layout
  Step conv2;
  // fc1's and fc2's passes; with bf16, each begins with the reorders to bfloat16 of what it
  // reads first (fc1's and fc2's forward: their input and weights; the backward weights
  // passes: the output gradient).
  std::vector<Step> fc1, fc2, fc2_backward_weights, fc2_backward_data, fc1_backward_weights, fc1_backward_data;
  bool own_fc1_forward = false;   // fc1's forward ours (own_fc1_forward), not the steps of fc1 above
  bool own_fc1_backward = false;  // fc1's backward passes ours (own_fc1_backward), not the steps above
  std::unique_ptr<Conv2WinogradForward> conv2_forward;  // or conv2 and its reorder (add_conv2_forward)
  std::unique_ptr<Conv2WinogradBackward> conv2_backward;
  std::array<std::string, kOpCount> impl;  // what runs each operation: oneDNN's implementation or ours
};

std::unique_ptr<Plan> build_plan(const dnnl::engine& engine, std::uint32_t batch, Isa isa, const Buffers& buf,
                                 float* params, float* grads);

void run(const std::vector<Step>& steps, const dnnl::stream& stream);

// Warns on stderr, once per process, when an operation of `plan` runs one of oneDNN's
// reference implementations (is_reference), which makes training many times slower.
void warn_if_reference(const Plan& plan, const std::string& device);

}  // namespace mnist_mt::cpu
