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
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cuda {
namespace {

using Clock = std::chrono::steady_clock;

// `timeout_s` seconds from now; never for 0 (no limit), as Place::timeout_s means it.
Clock::time_point deadline_after(double timeout_s) {
  const Clock::time_point now = Clock::now();
  const std::chrono::duration<double> limit(timeout_s);
  if (timeout_s <= 0 || limit >= Clock::time_point::max() - now) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(limit);
}

std::string seconds_text(double seconds) {
  std::ostringstream text;
  text << seconds;
  return text.str();
}

// World rank 0's process makes it; with several processes it is sent as an allgather, of
// which process 0's part counts: within --timeout.
ncclUniqueId unique_id(const Place& place) {
  ncclUniqueId id{};
  if (place.process() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  if (place.process_count() == 1) return id;
  std::vector<ncclUniqueId> all(static_cast<std::size_t>(place.process_count()));
  allgather_within(*place.processes, &id, all.data(), sizeof id, place.timeout_s, "for NCCL's unique id");
  return all[0];
}

// Owns the group's NCCL communicators; shared by its ranks' Communicators. With several
// processes they are non-blocking (ncclConfig_t::blocking = 0): no NCCL call holds its
// thread waiting for a peer process, so one that never comes ends in a timeout or an
// abort, which NCCL allows at any point then (its user guide, "Fault Tolerance"). In one
// process every peer is a thread of it: blocking, so that no collective pays for NCCL
// issuing it from a thread of its own.
class NcclGroup {
 public:
  // Throws RuntimeFailure, every communicator aborted, when a rank's initialisation fails
  // or outlasts place.timeout_s.
  NcclGroup(std::span<CudaDevice* const> devices, const Place& place)
      : devices_(devices.begin(), devices.end()),
        world_(place.world > 0 ? place.world : static_cast<int>(devices.size())),
        first_rank_(place.first_rank),
        timeout_s_(place.timeout_s),
        comms_(devices.size(), nullptr) {
    aborters_.reserve(comms_.size());  // abort() allocates nothing
    unaborted_.reserve(comms_.size());
    const ncclUniqueId id = unique_id(place);
    const Clock::time_point deadline = setup_deadline();
    try {
      init_ranks(id, place.process_count() > 1);
      settle_all("init", deadline);
    } catch (...) {
      abort();
      finish_aborts();  // no destructor runs after a constructor throws
      throw;
    }
  }

  // After the ranks' threads have ended and released their graphs: NCCL's destroy and
  // abort wait until no CUDA graph holds a collective of the communicator.
  ~NcclGroup() {
    if (!aborted()) {
      for (ncclComm_t comm : comms_) ncclCommDestroy(comm);
      return;
    }
    if (std::none_of(devices_.begin(), devices_.end(), [](const CudaDevice* d) { return d->wedged(); })) {
      finish_aborts();
      return;
    }
    // The aborts wait for work that outlived them (a graph never done is never released):
    // left running, as that work's buffers are left allocated.
    for (std::thread& t : aborters_) t.detach();
    std::cerr << "mnist_mt: warning: NCCL's abort left running: it waits for work that outlived the abort\n";
  }

  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const { return world_; }  // the world's ranks
  int first_rank() const { return first_rank_; }
  bool aborted() const { return aborted_->load(std::memory_order_acquire); }
  // For the group's devices, which report it from their waits.
  const std::shared_ptr<std::atomic<bool>>& aborted_flag() const { return aborted_; }
  // Where a setup phase that starts now gives up.
  Clock::time_point setup_deadline() const { return deadline_after(timeout_s_); }

  // call(rank's communicator), an NCCL call's result, or nullopt once the group is aborted,
  // which frees the communicators: the abort waits for calls under way, so none of them
  // uses a freed one. No call blocks on a non-blocking communicator: the abort waits briefly.
  template <typename Call>
  std::optional<ncclResult_t> issue(int rank, Call&& call) {
    const std::shared_lock lock = shared_unless_aborted();
    if (!lock) return std::nullopt;
    return call(comms_[static_cast<std::size_t>(rank)]);
  }

  // After a call returned ncclInProgress (NCCL issues the work from a thread of its own):
  // waits until `rank`'s communicator leaves that state, which NCCL requires before the
  // next call on it and before anything is ordered after the work on its stream. Each poll
  // holds the communicators on its own, so an abort may come between polls. The state
  // reached; nullopt once the group is aborted.
  std::optional<ncclResult_t> settle(int rank) {
    for (int polls = 0;; ++polls) {
      const std::optional<ncclResult_t> state = state_of(rank);
      if (state != ncclInProgress) return state;
      pause_between_polls(polls);
    }
  }

  // Main thread at setup (no other thread holds the group), after a call on every
  // communicator: as settle() for each, by `deadline`.
  void settle_all(const std::string& phase, Clock::time_point deadline) {
    std::vector<std::size_t> busy(comms_.size());
    std::iota(busy.begin(), busy.end(), std::size_t{0});
    for (int polls = 0;; ++polls) {
      std::vector<std::size_t> still;
      for (const std::size_t r : busy) {
        ncclResult_t state = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(comms_[r], &state));
        if (state == ncclInProgress) {
          still.push_back(r);
        } else if (state != ncclSuccess) {
          fail_setup({r}, phase, std::string("failed: ") + ncclGetErrorString(state));
        }
      }
      if (still.empty()) return;
      if (Clock::now() >= deadline) timed_out(still, phase);
      busy = std::move(still);
      pause_between_polls(polls);
    }
  }

  // Aborts every communicator and throws RuntimeFailure: ranks `which` (of this process)
  // were still in setup phase `phase` at the deadline.
  [[noreturn]] void timed_out(const std::vector<std::size_t>& which, const std::string& phase) {
    fail_setup(which, phase, "did not complete within " + seconds_text(timeout_s_) + " s");
  }

  // Throws RuntimeFailure, after aborting the group, once NCCL has reported an
  // asynchronous error on `rank`'s communicator (a failed peer connection, a remote error).
  void check(int rank, const std::string& device) {
    const std::optional<ncclResult_t> state = state_of(rank);
    if (!state || *state == ncclSuccess || *state == ncclInProgress) return;
    abort();
    throw RuntimeFailure(device + " rank " + std::to_string(first_rank_ + rank) + ": NCCL reported " +
                         ncclGetErrorString(*state) +
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
      if (comm == nullptr) continue;  // its initialisation never started
      try {
        aborters_.emplace_back([comm] { ncclCommAbort(comm); });
      } catch (...) {  // no thread: the destructor aborts it, once the graphs are released
        unaborted_.push_back(comm);
      }
    }
  }

 private:
  // One communicator per local device, ranks first_rank.. of the world, initialised
  // together as ncclCommInitAll does (one thread, several devices, inside a group): when
  // non-blocking, the group's end returns ncclInProgress while NCCL initialises them in
  // the background.
  void init_ranks(const ncclUniqueId& id, bool non_blocking) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = non_blocking ? 0 : 1;
    NCCL_CHECK(ncclGroupStart());
    ncclResult_t first = ncclSuccess;
    for (std::size_t i = 0; i < comms_.size() && first == ncclSuccess; ++i) {
      if (cudaSetDevice(devices_[i]->id()) != cudaSuccess) {
        first = ncclUnhandledCudaError;
        break;
      }
      first = ncclCommInitRankConfig(&comms_[i], world_, id, first_rank_ + static_cast<int>(i), &config);
      if (first == ncclInProgress) first = ncclSuccess;
    }
    const ncclResult_t end = ncclGroupEnd();
    NCCL_CHECK(first);
    if (end != ncclInProgress) NCCL_CHECK(end);
  }

  // ncclCommGetAsyncError of `rank`'s communicator, or nullopt once the group is aborted.
  std::optional<ncclResult_t> state_of(int rank) {
    return issue(rank, [](ncclComm_t comm) {
      ncclResult_t state = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
      return state;
    });
  }

  [[noreturn]] void fail_setup(const std::vector<std::size_t>& which, const std::string& phase,
                               const std::string& what) {
    abort();
    std::string ranks;
    for (const std::size_t r : which)
      ranks += (ranks.empty() ? "" : ", ") + devices_[r]->name() + " rank " +
               std::to_string(first_rank_ + static_cast<int>(r));
    throw RuntimeFailure(ranks + ": NCCL initialisation (phase " + phase + ") " + what +
                         "; every communicator was aborted");
  }

  // Joins the aborts abort() started, then makes those it found no thread for.
  void finish_aborts() noexcept {
    for (std::thread& t : aborters_) t.join();
    for (ncclComm_t comm : unaborted_) ncclCommAbort(comm);
  }

  const std::vector<CudaDevice*> devices_;  // outlive the group
  const int world_;
  const int first_rank_;
  const double timeout_s_;
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
