#pragma once
// A rank's pass over its shard of the test set: what training runs after each epoch
// and what `mnist_mt eval` runs on a checkpoint, so both report the same figures.
#include <array>
#include <cstdint>
#include <functional>

#include "mnist_mt/loader.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/replica.hpp"

namespace mnist_mt {

// Forward passes without dropout over the loader's batches for `rank`; returns the
// replica's loss and accuracy sums. With `confusion`, also counts each sample's
// (label, predicted class), which costs a copy of the log-probabilities per batch.
// `on_batch`, when set, runs as each batch arrives (the watchdog's heartbeat).
StepStats evaluate_shard(Replica& replica, Loader& loader, int rank, const DropoutKey& key,
                         ConfusionMatrix* confusion = nullptr, const std::function<void()>& on_batch = {});

}  // namespace mnist_mt
