#include "input.hpp"

#include <array>
#include <cstring>

#include "kernels.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cpu {
namespace {

const std::array<float, 256>& normalise_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) t[v] = (static_cast<float>(v) / 255.0f - kInputMean) / kInputStd;
    return t;
  }();
  return table;
}

}  // namespace

void normalise_images(const std::uint8_t* pixels, std::size_t count, float* out) {
  const std::array<float, 256>& table = normalise_table();
  for (std::size_t i = 0; i < count; ++i) out[i] = table[pixels[i]];
}


StagedInput::StagedInput(std::uint32_t max_batch)
    : images_(std::size_t{max_batch} * kImageBytes), labels_(max_batch), samples_(max_batch) {}

void StagedInput::stage(Stream& compute, const Batch& batch) {
  const std::size_t n = batch.size;
  compute.wait(ticket_);
  std::memcpy(images_.data(), batch.images.data(), n * kImageBytes);
  std::memcpy(labels_.data(), batch.labels.data(), n);
  std::memcpy(samples_.data(), batch.indices.data(), n * sizeof(std::uint32_t));
  samples_only_ = false;
}

void StagedInput::stage_samples(Stream& compute, std::span<const std::uint32_t> samples) {
  compute.wait(ticket_);
  std::memcpy(samples_.data(), samples.data(), samples.size() * sizeof(std::uint32_t));
  samples_only_ = true;
}

void StagedInput::unpack(Buffers& to, std::uint32_t n) const {
  if (!samples_only_) {
    normalise_images(images_.data(), std::size_t{n} * kImageBytes, to.input.get());
    std::memcpy(to.labels.get(), labels_.data(), n);
  }
  std::memcpy(to.samples.get(), samples_.data(), n * sizeof(std::uint32_t));
}

}  // namespace mnist_mt::cpu
