#pragma once
// A CPU replica's input on its way in: the host copies a batch to a staging area and
// returns; a task on the compute stream unpacks it into the replica's buffers
// (normalised images, labels, sample indices), so that the caller's batch is free at once.
#include <cstdint>
#include <span>
#include <vector>

#include "mnist_mt/batch.hpp"
#include "plan.hpp"
#include "stream.hpp"

namespace mnist_mt::cpu {

class StagedInput {
 public:
  explicit StagedInput(std::uint32_t max_batch);
  // Host: waits on `compute` until the previous input is unpacked, then copies the
  // batch's `batch.size` images, labels and samples (stage), or samples alone.
  void stage(Stream& compute, const Batch& batch);
  void stage_samples(Stream& compute, std::span<const std::uint32_t> samples);
  // Host: the ticket of the task that unpacks what was staged last.
  void unpacked_at(std::uint64_t ticket) { ticket_ = ticket; }
  // Compute thread: the first `n` staged samples into `to`, with their images and labels
  // unless only samples were staged.
  void unpack(Buffers& to, std::uint32_t n) const;

 private:
  std::vector<std::uint8_t> images_, labels_;
  std::vector<std::uint32_t> samples_;
  bool samples_only_ = false;
  std::uint64_t ticket_ = 0;
};

}  // namespace mnist_mt::cpu
