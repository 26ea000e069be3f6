#include "communicator.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>

#include "errors.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cuda {
namespace {

// Owns the group's NCCL communicators; shared by its ranks' Communicators.
class NcclGroup {
 public:
  explicit NcclGroup(std::span<CudaDevice* const> devices) {
    std::vector<int> ids;
    for (CudaDevice* d : devices) {
      ids.push_back(d->id());
      d->join_group(aborted_);
    }
    // Connect every peer now rather than inside a rank's first collective: there the
    // host thread would wait for its peers, and a peer that fails before it gets there
    // would leave that thread inside NCCL while abort() frees the communicator. A value
    // the user set wins.
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    comms_.resize(ids.size());
    NCCL_CHECK(ncclCommInitAll(comms_.data(), static_cast<int>(ids.size()), ids.data()));
  }

  ~NcclGroup() {
    if (aborted()) return;  // abort() freed them
    for (ncclComm_t comm : comms_) ncclCommDestroy(comm);
  }

  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }
  bool aborted() const { return aborted_->load(std::memory_order_acquire); }

  // Runs call(rank's communicator) unless the group was aborted, which frees the
  // communicators: abort() waits for calls under way, so none of them uses a freed one.
  // Calls only enqueue (peers are connected at setup), so abort() waits briefly.
  template <typename Call>
  bool with_comm(int rank, Call&& call) {
    const std::shared_lock lock(mutex_);
    if (aborted()) return false;
    call(comms_[static_cast<std::size_t>(rank)]);
    return true;
  }

  // The first call aborts every rank (kernels waiting for a peer return; the
  // communicators are freed); later calls, from any thread, find it done.
  void abort() noexcept {
    const std::unique_lock lock(mutex_);
    if (aborted_->exchange(true, std::memory_order_acq_rel)) return;
    for (ncclComm_t comm : comms_) ncclCommAbort(comm);
  }

 private:
  std::shared_mutex mutex_;  // shared: a call into a communicator; exclusive: abort()
  std::vector<ncclComm_t> comms_;
  // Shared with the group's devices, which report it from their synchronize().
  std::shared_ptr<std::atomic<bool>> aborted_ = std::make_shared<std::atomic<bool>>(false);
};

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclAvg; }

// Host values allreduce_host() moves through the device at a time.
constexpr std::size_t kHostChunk = 256;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int rank, CudaDevice& device)
      : group_(std::move(group)),
        rank_(rank),
        device_id_(device.id()),
        stream_(device.comm()),
        barrier_scratch_(1),
        host_scratch_(kHostChunk) {
    CUDA_CHECK(cudaMemset(barrier_scratch_.data(), 0, barrier_scratch_.bytes()));
  }

  ~NcclCommunicator() override { cudaSetDevice(device_id_); }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  void allreduce(float* data, std::size_t count, ReduceOp op) override {
    if (count == 0) return;
    guarded([&] {
      nccl([&](ncclComm_t c) { NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat, nccl_op(op), c, stream_)); });
    });
  }

  void broadcast(float* data, std::size_t count, int root) override {
    if (count == 0) return;
    guarded([&] {
      nccl([&](ncclComm_t c) { NCCL_CHECK(ncclBroadcast(data, data, count, ncclFloat, root, c, stream_)); });
    });
  }

  // NCCL writes the receive buffer on the root only, so the other ranks' data stays.
  void reduce(float* data, std::size_t count, ReduceOp op, int root) override {
    if (count == 0) return;
    guarded([&] {
      nccl([&](ncclComm_t c) { NCCL_CHECK(ncclReduce(data, data, count, ncclFloat, nccl_op(op), root, c, stream_)); });
    });
  }

  void barrier() override {
    float* one = barrier_scratch_.data();
    guarded([&] {
      nccl([&](ncclComm_t c) { NCCL_CHECK(ncclAllReduce(one, one, 1, ncclFloat, ncclSum, c, stream_)); });
    });
  }

  // The copies stay outside nccl(): from pageable memory they wait for the comm stream,
  // which only an abort may release.
  void allreduce_host(std::span<double> data) override {
    guarded([&] {
      CUDA_CHECK(cudaSetDevice(device_id_));
      double* scratch = host_scratch_.data();
      for (std::size_t at = 0; at < data.size(); at += kHostChunk) {
        const std::size_t n = std::min(kHostChunk, data.size() - at);
        CUDA_CHECK(cudaMemcpyAsync(scratch, data.data() + at, n * sizeof(double), cudaMemcpyHostToDevice, stream_));
        nccl([&](ncclComm_t c) { NCCL_CHECK(ncclAllReduce(scratch, scratch, n, ncclDouble, ncclSum, c, stream_)); });
        CUDA_CHECK(cudaMemcpyAsync(data.data() + at, scratch, n * sizeof(double), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        throw_if_aborted();
      }
    });
  }

  void abort() override { group_->abort(); }

 private:
  void throw_if_aborted() const {
    if (group_->aborted()) throw Aborted("cuda:" + std::to_string(device_id_) + " rank " + std::to_string(rank_) +
                                         ": collective released, the group was aborted");
  }

  // Calls into this rank's communicator, or throws Aborted once abort() has freed it.
  template <typename Call>
  void nccl(Call&& call) {
    if (!group_->with_comm(rank_, std::forward<Call>(call))) throw_if_aborted();
  }

  // Reports a call that failed because of an abort as Aborted.
  template <typename Call>
  void guarded(Call&& call) {
    try {
      call();
    } catch (const RuntimeFailure&) {
      throw_if_aborted();
      throw;
    }
  }

  std::shared_ptr<NcclGroup> group_;
  int rank_;
  int device_id_;
  cudaStream_t stream_;  // the device's comm stream; the device outlives its communicator
  DeviceBuffer<float> barrier_scratch_;
  DeviceBuffer<double> host_scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<CudaDevice* const> devices) {
  auto group = std::make_shared<NcclGroup>(devices);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (std::size_t rank = 0; rank < devices.size(); ++rank) {
    CudaDevice& device = *devices[rank];
    device.activate();  // the scratch buffers live on the rank's device
    comms.push_back(std::make_unique<NcclCommunicator>(group, static_cast<int>(rank), device));
  }
  return comms;
}

}  // namespace mnist_mt::cuda
