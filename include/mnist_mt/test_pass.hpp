#pragma once
// Every rank of a training configuration over its shard of the test set, with the
// parameters the configuration starts from (its checkpoint, else the seed's
// initialisation), on the trainer's devices and loaders and under its failure protocol:
// what `mnist_mt eval` runs (src/infer/evaluate.cpp).
#include <functional>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/loader.hpp"
#include "mnist_mt/replica.hpp"
#include "mnist_mt/trainer.hpp"

namespace mnist_mt {

// Runs on rank `rank`'s own thread, its device active: `replica` holds the starting
// parameters, `loader` yields the rank's test batches (Loader::next(rank)), `key` is the
// starting position's dropout key. May throw.
using TestShardPass = std::function<void(int rank, Replica& replica, Loader& loader, const DropoutKey& key)>;

// Calls `pass` once per rank of `config.devices`, concurrently, and returns once every
// rank's call returned. A rank that throws (or whose replica or loader could not be made,
// and then `pass` is not called) releases the others; the first failure that is not
// Aborted is rethrown as the trainer rethrows it ("rank R failed at step S: WHAT", an
// InputError kept an InputError). A bad configuration or checkpoint throws InputError
// before any rank starts.
void for_each_test_shard(Backend& backend, const Dataset& data, const TrainConfig& config, const TestShardPass& pass);

}  // namespace mnist_mt
