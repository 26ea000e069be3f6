#include "mnist_mt/predict.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt {
namespace {

constexpr std::uint32_t kMaxBatch = 256;

}  // namespace

std::vector<Prediction> predict(Backend& backend, int device, const Checkpoint& checkpoint,
                                const std::vector<DigitImage>& images) {
  if (checkpoint.params.size() != kParamCount) throw RuntimeFailure("predict: the checkpoint has no parameters");
  const std::vector<int> ids{device};
  const auto devices = backend.make_devices(ids);
  devices[0]->activate();
  const std::uint32_t capacity =
      std::clamp<std::uint32_t>(static_cast<std::uint32_t>(images.size()), 1, kMaxBatch);
  const auto replica = backend.make_replica(*devices[0], capacity);
  replica->write_params(checkpoint.params);

  Batch batch;
  batch.images.resize(std::size_t{capacity} * kImageBytes);
  batch.labels.assign(capacity, 0);  // unknown: only the loss sums, which are not read, use them
  batch.indices.assign(capacity, 0);
  std::vector<Prediction> out;
  std::vector<float> logprobs;
  for (std::size_t first = 0; first < images.size(); first += capacity) {
    batch.size = static_cast<std::uint32_t>(std::min<std::size_t>(capacity, images.size() - first));
    for (std::uint32_t i = 0; i < batch.size; ++i)
      std::memcpy(batch.images.data() + std::size_t{i} * kImageBytes, images[first + i].data(), kImageBytes);
    replica->set_input(batch);
    replica->forward(false, DropoutKey{}, batch.size);
    logprobs.resize(std::size_t{batch.size} * kClasses);
    replica->read_logprobs(logprobs);
    for (std::uint32_t i = 0; i < batch.size; ++i) {
      Prediction p;
      for (std::size_t c = 0; c < kClasses; ++c) p.probability[c] = std::exp(logprobs[i * kClasses + c]);
      p.digit = static_cast<int>(std::max_element(p.probability.begin(), p.probability.end()) - p.probability.begin());
      out.push_back(p);
    }
  }
  replica->take_stats();
  devices[0]->synchronize();
  return out;
}

}  // namespace mnist_mt
