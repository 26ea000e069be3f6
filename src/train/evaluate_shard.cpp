#include "mnist_mt/evaluate_shard.hpp"

#include <algorithm>
#include <vector>

namespace mnist_mt {

StepStats evaluate_shard(Replica& replica, Loader& loader, int rank, const DropoutKey& key,
                         ConfusionMatrix* confusion, const std::function<void()>& on_batch) {
  std::vector<float> logprobs;
  while (const Batch* batch = loader.next(static_cast<std::uint32_t>(rank))) {
    if (on_batch) on_batch();
    if (batch->size == 0) continue;
    replica.set_input(*batch);
    replica.forward(false, key, batch->size);
    if (confusion == nullptr) continue;
    logprobs.resize(std::size_t{batch->size} * kClasses);
    replica.read_logprobs(logprobs);
    for (std::uint32_t i = 0; i < batch->size; ++i) {
      const float* row = logprobs.data() + std::size_t{i} * kClasses;
      const auto predicted = std::max_element(row, row + kClasses) - row;  // the first of equal maxima
      ++(*confusion)[batch->labels[i]][static_cast<std::size_t>(predicted)];
    }
  }
  return replica.take_stats();
}

}  // namespace mnist_mt
