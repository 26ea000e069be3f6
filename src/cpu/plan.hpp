#pragma once
// The CPU replica's plan for one batch size: oneDNN's primitives bound to the replica's
// buffers (conv2's forward, fc1, fc2), conv2's Winograd backward, and the name of what runs
// each operation of the step. Built on the device's compute thread (replica.cpp).
#include <array>
#include <cstdint>
#include <dnnl.hpp>
#include <memory>
#include <string>
#include <vector>

#include "aligned.hpp"
#include "conv2_winograd.hpp"
#include "isa.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cpu {

// Activation buffers, sized for max_batch and shared by the plans of every batch size.
struct Buffers {
  explicit Buffers(std::size_t b)
      : max_batch(b),
        input(aligned_zeros<float>(b * kImageBytes)),
        act1(aligned_zeros<float>(b * kConv1Channels * kConv1Side * kConv1Side)),
        d_act1(aligned_zeros<float>(b * kConv1Channels * kConv1Side * kConv1Side)),
        act2(aligned_zeros<float>(b * kConv2Channels * kConv2Side * kConv2Side)),
        d_act2(aligned_zeros<float>(b * kConv2Channels * kConv2Side * kConv2Side)),
        argmax(aligned_zeros<std::uint8_t>(b * kFlat)),
        flat(aligned_zeros<float>(b * kFlat)),
        d_flat(aligned_zeros<float>(b * kFlat)),
        hidden(aligned_zeros<float>(b * kHidden)),
        d_hidden(aligned_zeros<float>(b * kHidden)),
        logits(aligned_zeros<float>(b * kClasses)),
        logp(aligned_zeros<float>(b * kClasses)),
        dlogits(aligned_zeros<float>(b * kClasses)),
        labels(aligned_zeros<std::uint8_t>(b)),
        samples(aligned_zeros<std::uint32_t>(b)) {}

  std::size_t max_batch;
  Aligned<float> input, act1, d_act1, act2, d_act2;
  Aligned<std::uint8_t> argmax;  // the pooling's, one byte an output
  Aligned<float> flat, d_flat, hidden, d_hidden, logits, logp, dlogits;
  Aligned<std::uint8_t> labels;
  Aligned<std::uint32_t> samples;
};
// The operations of a step, in order; each is timed (take_profile) and has one entry in a
// plan's kernel list. Weight reorders are part of the convolution pass they serve.
enum Op : int {
  kInputOp, kConv1Forward, kConv2Forward, kPoolForward, kDropout1Forward, kFc1Forward, kDropout2Forward,
  kFc2Forward, kLossOp, kFc2BackwardWeights, kFc2BackwardData, kDropout2Backward, kFc1BackwardWeights,
  kFc1BackwardData, kDropout1Backward, kPoolBackward, kConv2Backward, kConv1BackwardWeights, kSgdOp, kOpCount
};
constexpr std::array<const char*, kOpCount> kOpNames{
    "input (normalise)",     "conv1 forward (+ReLU)",      "conv2 forward",          "ReLU + pool forward",
    "dropout1 forward",      "fc1 forward (+ReLU)",        "dropout2 forward",       "fc2 forward",
    "log_softmax + NLL",     "fc2 backward_weights",       "fc2 backward_data",      "dropout2 + ReLU backward",
    "fc1 backward_weights",  "fc1 backward_data",          "dropout1 backward",      "ReLU + pool backward",
    "conv2 backward (weights + data)", "ReLU + conv1 backward_weights", "SGD"};

// A primitive with its arguments, run through the C API so a step allocates nothing.
struct Step {
  dnnl::primitive primitive;
  std::vector<dnnl_exec_arg_t> args;
  Op op = kOpCount;  // the operation it is (part of)
};

// Every primitive for one batch size, bound to the replica's buffers.
struct Plan {
  std::uint32_t batch = 0;
  std::vector<dnnl::memory> memories;     // keeps the memory objects behind Step::args alive
  std::vector<Aligned<float>> owned;  // conv2's weights in oneDNN's layouts
  std::vector<Step> weights_to_forward;  // conv2's weights: state-dict layout -> forward layout
  Step conv2, fc1, fc2;
  Step fc2_backward_weights, fc2_backward_data, fc1_backward_weights, fc1_backward_data;
  std::unique_ptr<Conv2WinogradBackward> conv2_backward;
  std::array<std::string, kOpCount> impl;  // what runs each operation: oneDNN's implementation or ours
};
std::unique_ptr<Plan> build_plan(const dnnl::engine& engine, std::uint32_t batch, Isa isa, const Buffers& buf,
                                 float* params, float* grads);

// Runs primitives on `stream`; a failure throws RuntimeFailure naming the operation and
// oneDNN's status.
void run(const Step& step, const dnnl::stream& stream);
void run(const std::vector<Step>& steps, const dnnl::stream& stream);

}  // namespace mnist_mt::cpu
