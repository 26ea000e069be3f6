#pragma once
// The operations of the CPU replica's training step, and a oneDNN primitive bound to its
// arguments as one of them.
#include <array>
#include <dnnl.hpp>
#include <string>
#include <vector>

#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {

// The operations of a step, in order; each is timed (take_profile) and has one entry in a
// plan's kernel list. Weight reorders are part of the convolution pass they serve.
enum Op : int {
  kInputOp, kConv1Forward, kConv2Forward, kPoolForward, kDropout1Forward, kFc1Forward, kDropout2Forward,
  kFc2Forward, kLossOp, kFc2BackwardWeights, kFc2BackwardData, kDropout2Backward, kFc1BackwardWeights,
  kFc1BackwardData, kDropout1Backward, kPoolBackward, kConv2Backward, kConv1BackwardWeights, kUpdateOp, kOpCount
};
constexpr std::array<const char*, kOpCount> kOpNames{
    "input (normalise)",    "conv1 forward (+ReLU)", "conv2 forward",        "ReLU + pool forward",
    "dropout1 forward",     "fc1 forward (+ReLU)",   "dropout2 forward",     "fc2 forward",
    "log_softmax + NLL",    "fc2 backward_weights",  "fc2 backward_data",    "dropout2 + ReLU backward",
    "fc1 backward_weights", "fc1 backward_data",     "dropout1 backward",    "ReLU + pool backward",
    "conv2 backward (weights + data)", "ReLU + conv1 backward_weights", "optimizer update"};
static_assert(kOpNames.back() != nullptr, "a name for every operation");

// A primitive with its arguments, run through the C API so a step allocates nothing.
struct Step {
  dnnl::primitive primitive;
  std::vector<dnnl_exec_arg_t> args;
  Op op = kOpCount;  // the operation it is (part of)
};

// Runs a step on `stream`; a failure throws RuntimeFailure naming the operation and
// oneDNN's status (the replica adds the device).
void run(const Step& step, const dnnl::stream& stream);

// What `make` returns (a primitive descriptor or a primitive of operation `op`); oneDNN's
// error while making it becomes a RuntimeFailure naming the operation.
template <class F>
auto planned(Op op, F&& make) -> decltype(make()) {
  try {
    return make();
  } catch (const dnnl::error& e) {
    throw RuntimeFailure(std::string("oneDNN: ") + kOpNames[op] + ": " + e.what());
  }
}

}  // namespace mnist_mt::cpu
