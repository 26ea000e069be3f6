#include "communicator.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>

#include "errors.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cuda {
namespace {

// Owns the group's NCCL communicators; shared by its ranks' Communicators.
class NcclGroup {
 public:
  NcclGroup(std::span<CudaDevice* const> devices, const Place& place)
      : world_(place.world > 0 ? place.world : static_cast<int>(devices.size())), first_rank_(place.first_rank) {
    std::vector<int> ids;
    for (CudaDevice* d : devices) ids.push_back(d->id());
    comms_.resize(ids.size());
    if (place.process_count() == 1) {
      NCCL_CHECK(ncclCommInitAll(comms_.data(), static_cast<int>(ids.size()), ids.data()));
    } else {
      init_ranks(ids, place);
    }
    aborters_.reserve(comms_.size());  // abort() allocates nothing
    unaborted_.reserve(comms_.size());
  }

  // After the ranks' threads have ended and released their graphs.
  ~NcclGroup() {
    if (!aborted()) {
      for (ncclComm_t comm : comms_) ncclCommDestroy(comm);
      return;
    }
    for (std::thread& t : aborters_) t.join();
    for (ncclComm_t comm : unaborted_) ncclCommAbort(comm);
  }

  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const { return world_; }  // the world's ranks
  int first_rank() const { return first_rank_; }
  bool aborted() const { return aborted_->load(std::memory_order_acquire); }
  // For the group's devices, which report it from their waits.
  const std::shared_ptr<std::atomic<bool>>& aborted_flag() const { return aborted_; }

  // Runs call(rank's communicator) unless the group was aborted, which frees the
  // communicators: the abort waits for calls under way, so none of them uses a freed one.
  // Calls only enqueue (peers are connected at setup), so the abort waits briefly.
  template <typename Call>
  bool with_comm(int rank, Call&& call) {
    const std::shared_lock lock = shared_unless_aborted();
    if (!lock) return false;
    call(comms_[static_cast<std::size_t>(rank)]);
    return true;
  }

  // Throws RuntimeFailure, after aborting the group, once NCCL has reported an
  // asynchronous error on `rank`'s communicator (a failed peer connection, a remote error).
  void check(int rank, const std::string& device) {
    ncclResult_t state = ncclSuccess;
    {
      const std::shared_lock lock = shared_unless_aborted();
      if (!lock) return;
      NCCL_CHECK(ncclCommGetAsyncError(comms_[static_cast<std::size_t>(rank)], &state));
    }
    if (state == ncclSuccess || state == ncclInProgress) return;
    abort();
    throw RuntimeFailure(device + " rank " + std::to_string(first_rank_ + rank) + ": NCCL reported " + ncclGetErrorString(state) +
                         " while the rank waited for its streams; every communicator was aborted");
  }

  // The first call aborts every rank (kernels waiting for a peer return; the
  // communicators are freed); later calls, from any thread, find it done. The ranks see
  // the flag at once. Each ncclCommAbort runs on a thread of its own: it returns only once
  // every CUDA graph that captured a collective of its communicator is released, which
  // that rank's thread does when it leaves, having seen the flag (it may be the caller),
  // and one rank's wait must not hold up the others' aborts.
  void abort() noexcept {
    if (aborted_->exchange(true, std::memory_order_acq_rel)) return;
    { const std::unique_lock wait_for_calls_under_way(mutex_); }  // none starts after the flag
    for (ncclComm_t comm : comms_) {
      try {
        aborters_.emplace_back([comm] { ncclCommAbort(comm); });
      } catch (...) {  // no thread: the destructor aborts it, once the graphs are released
        unaborted_.push_back(comm);
      }
    }
  }

 private:
  // One communicator per local device, ranks first_rank.. of the world, initialised
  // together (NCCL's documentation: one thread, several devices, inside a group).
  void init_ranks(const std::vector<int>& ids, const Place& place) {
    ncclUniqueId id{};
    if (place.process() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    // Sent as an allgather, of which process 0's part counts: within --timeout.
    std::vector<ncclUniqueId> all(static_cast<std::size_t>(place.process_count()));
    allgather_within(*place.processes, &id, all.data(), sizeof id, place.timeout_s, "for NCCL's unique id");
    id = all[0];
    NCCL_CHECK(ncclGroupStart());
    ncclResult_t first = ncclSuccess;
    for (std::size_t i = 0; i < ids.size() && first == ncclSuccess; ++i) {
      if (cudaSetDevice(ids[i]) != cudaSuccess) {
        first = ncclUnhandledCudaError;
        break;
      }
      first = ncclCommInitRank(&comms_[i], world_, id, first_rank_ + static_cast<int>(i));
    }
    const ncclResult_t end = ncclGroupEnd();
    NCCL_CHECK(first);
    NCCL_CHECK(end);
  }

  const int world_;
  const int first_rank_;
  std::shared_mutex mutex_;  // shared: a call into a communicator; exclusive: abort()
  std::vector<ncclComm_t> comms_;
  // Shared with the group's devices, which report it from their synchronize().
  std::shared_ptr<std::atomic<bool>> aborted_ = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::thread> aborters_;  // started by the first abort(), joined by the destructor
  std::vector<ncclComm_t> unaborted_;   // those abort() found no thread for

  // A shared hold of the communicators, or none once the group is aborted: a caller never
  // blocks behind the abort, which may be waiting for that caller's thread to leave.
  std::shared_lock<std::shared_mutex> shared_unless_aborted() {
    std::shared_lock lock(mutex_, std::defer_lock);
    while (!lock.try_lock()) {
      if (aborted()) return {};
      std::this_thread::yield();
    }
    if (aborted()) return {};
    return lock;
  }
};

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclAvg; }

// Host values allreduce_host() moves through the device at a time.
constexpr std::size_t kHostChunk = 256;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int rank, CudaDevice& device)
      : group_(std::move(group)),
        rank_(rank),
        device_(device),
        device_id_(device.id()),
        stream_(device.comm()),
        barrier_scratch_(1),
        host_scratch_(kHostChunk),
        host_staging_(kHostChunk) {
    CUDA_CHECK(cudaMemset(barrier_scratch_.data(), 0, barrier_scratch_.bytes()));
  }

  ~NcclCommunicator() override { cudaSetDevice(device_id_); }

  int rank() const override { return group_->first_rank() + rank_; }
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

  // Point-to-point inside a group, as NCCL's documentation builds a scatter and a gather.
  void scatter(float* data, std::span<const std::size_t> counts, int root) override {
    point_to_point(data, counts, root, true);
  }
  void gather(float* data, std::span<const std::size_t> counts, int root) override {
    point_to_point(data, counts, root, false);
  }

  void barrier() override {
    float* one = barrier_scratch_.data();
    guarded([&] {
      nccl([&](ncclComm_t c) { NCCL_CHECK(ncclAllReduce(one, one, 1, ncclFloat, ncclSum, c, stream_)); });
    });
  }

  // Through pinned memory, so the copies are truly asynchronous and ordered on the comm
  // stream like the collective; the host waits by polling (CudaDevice::wait_stream).
  void allreduce_host(std::span<double> data) override {
    guarded([&] {
      CUDA_CHECK(cudaSetDevice(device_id_));
      double* scratch = host_scratch_.data();
      double* staging = host_staging_.data();
      for (std::size_t at = 0; at < data.size(); at += kHostChunk) {
        const std::size_t n = std::min(kHostChunk, data.size() - at);
        std::copy_n(data.data() + at, n, staging);
        CUDA_CHECK(cudaMemcpyAsync(scratch, staging, n * sizeof(double), cudaMemcpyHostToDevice, stream_));
        nccl([&](ncclComm_t c) { NCCL_CHECK(ncclAllReduce(scratch, scratch, n, ncclDouble, ncclSum, c, stream_)); });
        CUDA_CHECK(cudaMemcpyAsync(staging, scratch, n * sizeof(double), cudaMemcpyDeviceToHost, stream_));
        device_.wait_stream(stream_);
        throw_if_aborted();
        std::copy_n(staging, n, data.data() + at);
      }
    });
  }

  void abort() override { group_->abort(); }

 private:
  void throw_if_aborted() const {
    if (group_->aborted()) throw Aborted("cuda:" + std::to_string(device_id_) + " rank " + std::to_string(rank_) +
                                         ": collective released, the group was aborted");
  }

  // Root sends (scatter) or receives (gather) every other rank's chunk at its offset; the
  // others receive or send their own.
  void point_to_point(float* data, std::span<const std::size_t> counts, int root, bool scatter) {
    check_chunks(*this, counts, root);
    guarded([&] {
      nccl([&](ncclComm_t c) {
        NCCL_CHECK(ncclGroupStart());
        try {
          if (rank() == root) {
            std::size_t at = 0;
            for (int r = 0; r < size(); ++r) {
              const std::size_t n = counts[static_cast<std::size_t>(r)];
              if (r != root && n > 0) {
                if (scatter)
                  NCCL_CHECK(ncclSend(data + at, n, ncclFloat, r, c, stream_));
                else
                  NCCL_CHECK(ncclRecv(data + at, n, ncclFloat, r, c, stream_));
              }
              at += n;
            }
          } else if (const std::size_t n = counts[static_cast<std::size_t>(rank())]; n > 0) {
            if (scatter)
              NCCL_CHECK(ncclRecv(data, n, ncclFloat, root, c, stream_));
            else
              NCCL_CHECK(ncclSend(data, n, ncclFloat, root, c, stream_));
          }
        } catch (...) {
          ncclGroupEnd();
          throw;
        }
        NCCL_CHECK(ncclGroupEnd());
      });
    });
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
  CudaDevice& device_;  // outlives its communicator
  int device_id_;
  cudaStream_t stream_;  // the device's comm stream; the device outlives its communicator
  DeviceBuffer<float> barrier_scratch_;
  DeviceBuffer<double> host_scratch_;
  PinnedBuffer<double> host_staging_;
};

// Main thread, right after ncclCommInitAll: one grouped round of every collective the
// trainer issues, at the sizes it issues them, so NCCL connects every peer now (its
// connections are made lazily, at a collective's first call) rather than inside a rank's
// first step, where the host thread would wait for peers that may have failed meanwhile.
void connect_peers(std::span<CudaDevice* const> devices, std::span<const std::unique_ptr<Communicator>> comms) {
  std::vector<DeviceBuffer<float>> buffers;
  for (CudaDevice* d : devices) {
    d->activate();
    buffers.emplace_back(kParamCount);
    CUDA_CHECK(cudaMemsetAsync(buffers.back().data(), 0, buffers.back().bytes(), d->comm()));
  }
  const auto grouped = [&](const auto& call) {
    NCCL_CHECK(ncclGroupStart());
    for (std::size_t r = 0; r < comms.size(); ++r) {
      devices[r]->activate();
      call(*comms[r], buffers[r].data());
    }
    NCCL_CHECK(ncclGroupEnd());
  };
  for (const std::size_t count : {std::size_t{1}, std::size_t{1} << 18, kParamCount}) {
    grouped([&](Communicator& c, float* b) { c.allreduce(b, count, ReduceOp::kAverage); });
    grouped([&](Communicator& c, float* b) { c.broadcast(b, count, 0); });
    grouped([&](Communicator& c, float* b) { c.reduce(b, count, ReduceOp::kSum, 0); });
  }
  // The DataParallel baseline's point-to-point scatter and gather connect too (it runs
  // in one process).
  if (comms[0]->size() == static_cast<int>(comms.size())) {
    const std::vector<std::size_t> chunks(devices.size(), 1);
    grouped([&](Communicator& c, float* b) { c.scatter(b, chunks, 0); });
    grouped([&](Communicator& c, float* b) { c.gather(b, chunks, 0); });
  }
  for (std::size_t r = 0; r < devices.size(); ++r) {
    devices[r]->activate();
    devices[r]->synchronize();
    buffers[r] = DeviceBuffer<float>();  // released on its own device
  }
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<CudaDevice* const> devices, bool record,
                                                              const Place& place) {
  std::set<int> ids;
  for (CudaDevice* d : devices) ids.insert(d->id());
  if (ids.size() != devices.size())
    throw RuntimeFailure("NCCL takes one rank a GPU: ranks that share a GPU meet in the local group "
                         "(make_local_communicators)");

  auto group = std::make_shared<NcclGroup>(devices, place);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (std::size_t rank = 0; rank < devices.size(); ++rank) {
    CudaDevice& device = *devices[rank];
    device.join_group(group->aborted_flag(), [weak = std::weak_ptr<NcclGroup>(group), rank, name = device.name()] {
      if (const auto g = weak.lock()) g->check(static_cast<int>(rank), name);
    });
    device.allow_record(record);
    device.activate();  // the scratch buffers live on the rank's device
    comms.push_back(std::make_unique<NcclCommunicator>(group, static_cast<int>(rank), device));
  }
  connect_peers(devices, comms);
  return comms;
}

}  // namespace mnist_mt::cuda
