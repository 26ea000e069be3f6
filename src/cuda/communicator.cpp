#include "communicator.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <iostream>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "errors.hpp"
#include "nccl_group.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cuda {
namespace {

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclAvg; }

class NcclCommunicator;
// This thread's depth of start_nccl_group() brackets and the communicators called inside
// them, whose work the outermost end_nccl_group() waits for NCCL to issue.
thread_local int nccl_group_depth = 0;
thread_local std::vector<NcclCommunicator*> called_in_group;

// ncclGroupEnd, whose ncclInProgress is no error: the communicators are non-blocking, and
// NCCL issues the group's work from a thread of its own.
void close_nccl_group() {
  const ncclResult_t end = ncclGroupEnd();
  if (end != ncclInProgress) NCCL_CHECK(end);
}

// Host values allreduce_host() moves through the device at a time.
constexpr std::size_t kHostChunk = 256;

// Where a call on a communicator is made, for its error's message (NCCL_CHECK's context).
struct CallSite {
  const char* expression;
  const char* function;
  const char* file;
  int line;
};

// NCCL_CHECK for a call on this rank's communicator, `c` in `expr` (NcclCommunicator::nccl).
#define NCCL_ISSUE(expr) nccl([&](ncclComm_t c) { return expr; }, {#expr, __func__, __FILE__, __LINE__})

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
    NCCL_ISSUE(ncclAllReduce(data, data, count, ncclFloat, nccl_op(op), c, stream_));
  }

  void broadcast(float* data, std::size_t count, int root) override {
    if (count == 0) return;
    NCCL_ISSUE(ncclBroadcast(data, data, count, ncclFloat, root, c, stream_));
  }

  // NCCL writes the receive buffer on the root only, so the other ranks' data stays.
  void reduce(float* data, std::size_t count, ReduceOp op, int root) override {
    if (count == 0) return;
    NCCL_ISSUE(ncclReduce(data, data, count, ncclFloat, nccl_op(op), root, c, stream_));
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
    NCCL_ISSUE(ncclAllReduce(one, one, 1, ncclFloat, ncclSum, c, stream_));
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
        NCCL_ISSUE(ncclAllReduce(scratch, scratch, n, ncclDouble, ncclSum, c, stream_));
        CUDA_CHECK(cudaMemcpyAsync(staging, scratch, n * sizeof(double), cudaMemcpyDeviceToHost, stream_));
        device_.wait_stream(stream_);
        throw_if_aborted();
        std::copy_n(staging, n, data.data() + at);
      }
    });
  }

  void abort() override { group_->abort(); }

  // The outermost end_nccl_group(), after a call of this communicator inside it: waits
  // until NCCL has issued the call's work.
  void finish_group() { settled(group_->settle(rank_), {"ncclGroupEnd", __func__, __FILE__, __LINE__}); }

 private:
  [[noreturn]] void throw_aborted() const {
    throw Aborted("cuda:" + std::to_string(device_id_) + " rank " + std::to_string(rank_) +
                  ": collective released, the group was aborted");
  }
  void throw_if_aborted() const {
    if (group_->aborted()) throw_aborted();
  }

  // Root sends (scatter) or receives (gather) every other rank's chunk at its offset; the
  // others receive or send their own.
  void point_to_point(float* data, std::span<const std::size_t> counts, int root, bool scatter) {
    check_chunks(*this, counts, root);
    const auto transfer = [&](bool send, float* at, std::size_t n, int peer, ncclComm_t c) {
      return send ? ncclSend(at, n, ncclFloat, peer, c, stream_) : ncclRecv(at, n, ncclFloat, peer, c, stream_);
    };
    const auto exchange = [&](ncclComm_t c) {
      ncclResult_t state = ncclGroupStart();
      if (state != ncclSuccess) return state;
      if (rank() == root) {
        std::size_t at = 0;
        for (int r = 0; r < size() && state == ncclSuccess; ++r) {
          const std::size_t n = counts[static_cast<std::size_t>(r)];
          if (r != root && n > 0) state = transfer(scatter, data + at, n, r, c);
          at += n;
        }
      } else if (const std::size_t n = counts[static_cast<std::size_t>(rank())]; n > 0) {
        state = transfer(!scatter, data, n, root, c);
      }
      // Closed whatever happened: the end reports a failed call of the group too.
      const ncclResult_t end = ncclGroupEnd();
      return state != ncclSuccess ? state : end;
    };
    nccl(exchange, {"ncclSend/ncclRecv in a group", __func__, __FILE__, __LINE__});
  }

  // Issues call(this rank's communicator), which returns the NCCL call's result, and waits
  // until NCCL has put the work on the stream (a non-blocking communicator may still be
  // issuing it when the call returns ncclInProgress); inside start/end_nccl_group() the
  // group's end does. Throws Aborted once abort() has freed the communicator, or when a
  // call failed because of an abort.
  template <typename Call>
  void nccl(Call&& call, const CallSite& site) {
    std::optional<ncclResult_t> state = group_->issue(rank_, std::forward<Call>(call));
    if (state == ncclSuccess && nccl_group_depth > 0) called_in_group.push_back(this);
    if (state == ncclInProgress) state = group_->settle(rank_);
    settled(state, site);
  }

  void settled(std::optional<ncclResult_t> state, const CallSite& site) const {
    if (!state) throw_aborted();
    if (*state == ncclSuccess) return;
    throw_if_aborted();
    raise_failure("NCCL", ncclGetErrorString(*state), site.expression, site.function, site.file, site.line);
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

// Frees each device's buffer on its device (none once a device is wedged: owners.hpp).
void release(std::span<CudaDevice* const> devices, std::vector<DeviceBuffer<float>>& buffers) {
  for (std::size_t r = 0; r < buffers.size(); ++r) {
    cudaSetDevice(devices[r]->id());
    buffers[r] = DeviceBuffer<float>();
  }
}

// Main thread, right after the communicators are made: one grouped round of every
// collective the trainer issues, at the sizes it issues them, so NCCL connects every peer
// now (its connections are made lazily, at a collective's first call) rather than inside a
// rank's first step, where the host thread would wait for peers that may have failed
// meanwhile. Phase "first collective" of the setup, under --timeout as initialisation is:
// a peer that never joins ends it in a RuntimeFailure, every communicator aborted.
void connect_peers(NcclGroup& group, std::span<CudaDevice* const> devices,
                   std::span<const std::unique_ptr<Communicator>> comms) {
  const Clock::time_point deadline = group.setup_deadline();
  std::vector<DeviceBuffer<float>> buffers;
  try {
    for (CudaDevice* d : devices) {
      d->activate();
      buffers.emplace_back(kParamCount);
      CUDA_CHECK(cudaMemsetAsync(buffers.back().data(), 0, buffers.back().bytes(), d->comm()));
    }
    // Inside the group a call only queues its work (its communicator stays ncclSuccess);
    // the end issues it, in the background, and every communicator settles before the next.
    const auto grouped = [&](const auto& call) {
      NCCL_CHECK(ncclGroupStart());
      try {
        for (std::size_t r = 0; r < comms.size(); ++r) {
          devices[r]->activate();
          call(*comms[r], buffers[r].data());
        }
      } catch (...) {
        ncclGroupEnd();
        throw;
      }
      close_nccl_group();
      group.settle_all("first collective", deadline);
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
    // The kernels wait for every peer; a peer that never joins keeps them waiting.
    std::vector<std::size_t> busy;
    for (std::size_t r = 0; r < devices.size(); ++r) {
      devices[r]->activate();
      if (!devices[r]->wait_stream_until(devices[r]->comm(), deadline)) busy.push_back(r);
    }
    if (!busy.empty()) group.timed_out(busy, "first collective");
  } catch (...) {
    group.abort();  // the streams drain once their collectives are released
    for (CudaDevice* d : devices) {
      try {
        d->activate();
        d->synchronize();
      } catch (...) {  // the failure rethrown below explains it
      }
    }
    release(devices, buffers);
    throw;
  }
  release(devices, buffers);
}

}  // namespace

void start_nccl_group() {
  NCCL_CHECK(ncclGroupStart());
  ++nccl_group_depth;
}

void end_nccl_group() {
  std::vector<NcclCommunicator*> called;
  if (--nccl_group_depth == 0) called.swap(called_in_group);
  close_nccl_group();
  std::exception_ptr first;  // every communicator settles, the first failure is reported
  for (NcclCommunicator* c : called) {
    try {
      c->finish_group();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

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
  connect_peers(*group, devices, comms);
  return comms;
}

}  // namespace mnist_mt::cuda
