#include "step_stats.hpp"

#include <string>

#include "errors.hpp"
#include "kernels.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cuda {

StepStatsBook::StepStatsBook(CudaDevice& device)
    : device_(device), stats_(kStatCount), host_(kStatsReported * kSlots) {
  for (auto& e : events_) e = make_event();
}

void StepStatsBook::clear(cudaStream_t stream, bool all) {
  CUDA_CHECK(cudaMemsetAsync(stats_.data(), 0, all ? stats_.bytes() : kStatHalted * sizeof(double), stream));
}

std::uint64_t StepStatsBook::snapshot(cudaStream_t stream) {
  device_.activate();
  const std::uint64_t handle = taken_++;
  const std::size_t slot = handle % kSlots;
  constexpr std::size_t kBytes = kStatsReported * sizeof(double);
  commit_stats(stats_.data(), stream);
  CUDA_CHECK(cudaMemcpyAsync(host_.data() + slot * kStatsReported, stats_.data(), kBytes, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemsetAsync(stats_.data(), 0, kBytes, stream));
  CUDA_CHECK(cudaEventRecord(events_[slot].get(), stream));
  return handle;
}

std::optional<StepStats> StepStatsBook::read(std::uint64_t handle, bool wait) {
  if (handle >= taken_ || handle + kSlots <= taken_)
    throw RuntimeFailure(device_.name() + ": read_stats of snapshot " + std::to_string(handle) + ", not held");
  device_.activate();
  const std::size_t slot = handle % kSlots;
  cudaEvent_t event = events_[slot].get();
  if (!wait) {
    const cudaError_t state = cudaEventQuery(event);
    if (state == cudaErrorNotReady) return std::nullopt;
    CUDA_CHECK(state);
  }
  device_.wait_event(event);
  device_.throw_if_aborted();
  const double* s = host_.data() + slot * kStatsReported;
  StepStats stats{s[kStatLoss], s[kStatCorrect], s[kStatSamples], static_cast<std::uint64_t>(s[kStatSkipped]), {}};
  if (s[kStatNonFinite] != 0)
    stats.non_finite =
        NonFiniteStep{static_cast<std::uint64_t>(s[kStatNonFiniteStep]), s[kStatNonFiniteLoss], s[kStatNonFiniteNorm]};
  return stats;
}

}  // namespace mnist_mt::cuda
