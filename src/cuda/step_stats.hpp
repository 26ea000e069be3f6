#pragma once
// A CUDA replica's step statistics: kernels.hpp's Stat layout in device memory (the
// kernels add to it and decide guarded updates there), and the ring of snapshots the host
// reads back through pinned memory, each behind an event.
#include <array>
#include <cstdint>
#include <optional>

#include "device.hpp"
#include "mnist_mt/replica.hpp"
#include "owners.hpp"

namespace mnist_mt::cuda {

class StepStatsBook {
 public:
  explicit StepStatsBook(CudaDevice& device);
  // The device's Stat array, for the kernels that add to it.
  double* data() { return stats_.data(); }
  // Queued on `stream`: clears the statistics (and with `all`, the halt flag and the count
  // of guarded updates too).
  void clear(cudaStream_t stream, bool all);
  // Queued on `stream`: commits the pending forwards, copies the stats to a host slot and
  // clears them. read() of the handle waits for the copy (or, without `wait`, returns
  // nothing while it is not done).
  std::uint64_t snapshot(cudaStream_t stream);
  std::optional<StepStats> read(std::uint64_t handle, bool wait);

 private:
  static constexpr std::uint64_t kSlots = Replica::kSnapshots;
  CudaDevice& device_;
  DeviceBuffer<double> stats_;
  PinnedBuffer<double> host_;  // kSlots slots of kStatsReported
  std::array<EventOwner, kSlots> events_;
  std::uint64_t taken_ = 0;
};

}  // namespace mnist_mt::cuda
