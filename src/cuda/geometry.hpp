#pragma once
// The network's geometry (mnist_mt/model.hpp) as cuDNN and the kernels take it.
#include "conv.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cuda {

// C: channels, P: positions per channel, A: per sample.
constexpr int kC1 = static_cast<int>(kConv1Channels), kP1 = static_cast<int>(kConv1Side * kConv1Side);
constexpr int kC2 = static_cast<int>(kConv2Channels), kP2 = static_cast<int>(kConv2Side * kConv2Side);
constexpr int kA1 = kC1 * kP1;
constexpr int kA2 = kC2 * kP2;
constexpr int kPoolSideInt = static_cast<int>(kPoolSide);
constexpr int kFc1In = static_cast<int>(kFlat);
constexpr int kFc1Out = static_cast<int>(kHidden);
constexpr int kFc2Out = static_cast<int>(kClasses);
constexpr ConvShape kConv1Shape{1, kC1, static_cast<int>(kImageSide), 3};
constexpr ConvShape kConv2Shape{kC1, kC2, static_cast<int>(kConv1Side), 3};
static_assert(kConv1Shape.out_side() == static_cast<int>(kConv1Side) &&
              kConv2Shape.out_side() == static_cast<int>(kConv2Side));

}  // namespace mnist_mt::cuda
