#pragma once
// `mnist_mt predict`: the class of each image under a checkpoint's weights, on one
// device of a backend.
#include <array>
#include <cstdint>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/image.hpp"

namespace mnist_mt {

struct Prediction {
  int digit = 0;                        // argmax
  std::array<float, kClasses> probability{};
};

// One prediction per image, in order, through the same forward pass as evaluation.
std::vector<Prediction> predict(Backend& backend, int device, const Checkpoint& checkpoint,
                                const std::vector<DigitImage>& images);

}  // namespace mnist_mt
