#pragma once
// The template's network (docs/architecture.md): its parameters in PyTorch state-dict order,
// each a view into one flat buffer.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace mnist_mt {

struct ParamInfo {
  std::string_view name;
  std::array<std::int64_t, 4> shape;  // PyTorch's shape; unused trailing dims are 0
  int dims;
  std::size_t offset;  // into the flat buffer, in floats
  std::size_t count;
};

// conv1 Conv2d(1,32,3,1) -> ReLU -> conv2 Conv2d(32,64,3,1) -> ReLU -> max_pool2d(2)
// -> Dropout(0.25) -> flatten(9216) -> fc1 Linear(9216,128) -> ReLU -> Dropout(0.5)
// -> fc2 Linear(128,10) -> log_softmax
inline constexpr std::array<ParamInfo, 8> kParams{{
    {"conv1.weight", {32, 1, 3, 3}, 4, 0, 288},
    {"conv1.bias", {32, 0, 0, 0}, 1, 288, 32},
    {"conv2.weight", {64, 32, 3, 3}, 4, 320, 18432},
    {"conv2.bias", {64, 0, 0, 0}, 1, 18752, 64},
    {"fc1.weight", {128, 9216, 0, 0}, 2, 18816, 1179648},
    {"fc1.bias", {128, 0, 0, 0}, 1, 1198464, 128},
    {"fc2.weight", {10, 128, 0, 0}, 2, 1198592, 1280},
    {"fc2.bias", {10, 0, 0, 0}, 1, 1199872, 10},
}};
inline constexpr std::size_t kParamCount = 1199882;

// Layers with parameters, in forward order. Layer l owns kParams[2l] (weight) and
// kParams[2l+1] (bias); its gradients are the contiguous range layer_range(l).
enum Layer : int { kConv1 = 0, kConv2 = 1, kFc1 = 2, kFc2 = 3 };
inline constexpr int kLayers = 4;
struct Range {
  std::size_t offset;
  std::size_t count;
};
constexpr Range layer_range(int layer) {
  return {kParams[2 * layer].offset, kParams[2 * layer].count + kParams[2 * layer + 1].count};
}

// The input: one 28x28 grey image of one of ten classes (MNIST and Fashion-MNIST alike).
inline constexpr std::size_t kImageSide = 28;
inline constexpr std::size_t kImageBytes = kImageSide * kImageSide;
inline constexpr std::size_t kClasses = 10;
// An evaluation's outcome: [label][predicted class] -> samples.
using ConfusionMatrix = std::array<std::array<std::uint64_t, kClasses>, kClasses>;

// Activation geometry (square maps, side x side per channel), shared by the backends.
inline constexpr std::size_t kConv1Channels = 32, kConv1Side = 26;  // conv1 3x3 on 28x28
inline constexpr std::size_t kConv2Channels = 64, kConv2Side = 24;  // conv2 3x3 on 26x26
inline constexpr std::size_t kPoolSide = kConv2Side / 2;             // max_pool2d(2)
inline constexpr std::size_t kFlat = kConv2Channels * kPoolSide * kPoolSide;  // fc1's input, 9216
inline constexpr std::size_t kHidden = 128;                          // fc1's output
static_assert(kFlat == 9216);

inline constexpr float kDropout1 = 0.25f;  // after max_pool2d
inline constexpr float kDropout2 = 0.5f;   // after fc1
inline constexpr float kInputMean = 0.1307f;
inline constexpr float kInputStd = 0.3081f;

// PyTorch's default initialisation (kaiming_uniform_ with a=sqrt(5) for weights, i.e.
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for biases), drawn from
// Philox keyed by `seed`: the same values on every backend and world size.
void init_parameters(std::uint64_t seed, std::span<float> params);
// The same, in a new buffer of kParamCount floats.
std::vector<float> initial_parameters(std::uint64_t seed);

}  // namespace mnist_mt
