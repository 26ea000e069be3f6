#pragma once
// The NCCL communicators of one group of ranks (this process's, of a world that may span
// processes), their setup within --timeout, their asynchronous errors and their abort:
// shared by the ranks' Communicators (communicator.cpp). Included by communicator.cpp only.
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
#include <vector>

#include "communicator.hpp"
#include "errors.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cuda {
namespace nccl_group_detail {

using Clock = std::chrono::steady_clock;

// `timeout_s` seconds from now; never for 0 (no limit), as Place::timeout_s means it.
inline Clock::time_point deadline_after(double timeout_s) {
  const Clock::time_point now = Clock::now();
  const std::chrono::duration<double> limit(timeout_s);
  if (timeout_s <= 0 || limit >= Clock::time_point::max() - now) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(limit);
}

inline std::string seconds_text(double seconds) {
  std::ostringstream text;
  text << seconds;
  return text.str();
}

// World rank 0's process makes it; with several processes it is sent as an allgather, of
// which process 0's part counts: within --timeout.
inline ncclUniqueId unique_id(const Place& place) {
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

}  // namespace nccl_group_detail

using nccl_group_detail::Clock;
using nccl_group_detail::NcclGroup;

}  // namespace mnist_mt::cuda
