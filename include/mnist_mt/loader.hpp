#pragma once
// oneTBB pipeline that gathers every rank's batches of one epoch into reusable
// buffers and hands them to per-rank bounded queues, a few batches ahead of the
// consumers. Images stay uint8: normalisation happens on the device.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mnist_mt/batch.hpp"
#include "mnist_mt/dataset.hpp"

namespace mnist_mt {

struct LoaderOptions {
  std::uint32_t world = 1;       // ranks of every process: the shards
  // This process's ranks: world ranks first_rank .. first_rank + ranks - 1, which next()
  // numbers 0 .. ranks - 1; ranks 0: every rank of the world.
  std::uint32_t first_rank = 0;
  std::uint32_t ranks = 0;
  std::uint32_t batch = 64;      // per rank
  bool train = true;             // shuffled, drop_last; false: split order, every sample once
  std::uint64_t seed = 0;
  std::uint32_t epoch = 0;
  std::uint32_t depth = 4;       // batches a rank's queue holds ahead of its consumer
};

class Loader {
 public:
  // Starts the pipeline for one epoch of `split` (which must outlive the loader).
  Loader(const Split& split, const LoaderOptions& options);
  ~Loader();  // cancels and joins; never throws
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  std::uint32_t steps() const;
  // The samples `rank` (as next() counts) takes in steps [first, steps()), in order, and
  // the split's images they index: what a GPU keeps to gather them itself
  // (Replica::plan_epoch). Any thread; the pipeline need not have reached them.
  std::vector<std::uint32_t> rank_samples(std::uint32_t rank, std::uint32_t first) const;
  const std::uint8_t* split_images() const;

  // Blocks until rank's next batch is ready (`rank` counts this process's ranks). Returns nullptr after the last step,
  // or once cancelled. Rethrows an error raised inside the pipeline.
  // The batch stays valid until the same rank's next call to next().
  const Batch* next(std::uint32_t rank);

  // Stops the pipeline early; wakes every consumer blocked in next(). Idempotent.
  void cancel();

 private:
  friend struct LoaderTesting;  // src/data/loader_testing.hpp
  struct State;
  Loader(const Split& split, const LoaderOptions& options, std::function<void(std::uint32_t step)> before_gather);
  std::unique_ptr<State> state_;
};

}  // namespace mnist_mt
