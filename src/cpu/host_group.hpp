#pragma once
// The ranks of one process meeting over host memory: an abortable barrier and the
// collectives built on it (docs/architecture.md decisions 1 and 10). The CPU communicator runs them
// on its ranks' comm streams; the CUDA backend runs them on host threads for ranks that
// share a GPU, through pinned staging buffers.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "mnist_mt/communicator.hpp"
#include "mnist_mt/processes.hpp"

namespace mnist_mt::cpu {

// Every method but abort() runs on a thread of its rank, inside a collective that all
// ranks enter in the same order. Sums add each element in rank order 0..W-1 whatever the
// count or chunking, so results are bitwise reproducible; an average is that sum / W.
// With shards, allreduce() adds every rank's parts in turn, as W ranks of a part each
// would, and an average divides by the parts.
//
// With `processes` (several of them, each with a group of as many ranks) the group's
// allreduce, allreduce_host, broadcast (from world rank 0) and barrier span the world,
// hierarchically: the ranks of each process reduce in rank order into rank 0's buffer,
// rank 0's thread exchanges that sum with every other process (Processes::allgather)
// and adds the processes' sums in process order, and every rank copies the result. So
// every process holds the same bits, and a rerun repeats them; an average divides by
// the world's ranks (parts). reduce, scatter and gather stay within one process.
class HostGroup {
 public:
  // `shards`: the buffers each rank passes to allreduce() (Place::shards; empty: one each).
  explicit HostGroup(int size, std::shared_ptr<Processes> processes = nullptr, std::vector<int> shards = {});
  int size() const { return size_; }  // this process's ranks
  // Every process's ranks.
  int world() const { return size_ * (processes_ ? processes_->count() : 1); }

  void barrier();
  // Communicator::barrier: every rank of the world (barrier() is this process's).
  void world_barrier(int rank);
  // Any thread: releases every rank waiting in a collective, now or later, with Aborted.
  void abort();
  bool aborted() const;

  // Returns the sum of squares of the result, the same bits on every rank: each rank's
  // chunk summed as it is reduced, the chunks' sums added in rank order.
  double allreduce(int rank, float* data, std::size_t count, ReduceOp op) {
    return allreduce(rank, std::span(&data, 1), count, op);
  }
  // Each rank's `parts` (as many as its shards) added in world order, rank by rank and
  // each rank's in their order, as if each part were a rank of its own (an average
  // divides by every part of the world); the result lands in each rank's last.
  double allreduce(int rank, std::span<float* const> parts, std::size_t count, ReduceOp op);
  void broadcast(int rank, float* data, std::size_t count, int root);
  // The result lands in root's buffer only; root gets its sum of squares as allreduce
  // does, the others 0.
  double reduce(int rank, float* data, std::size_t count, ReduceOp op, int root);
  // Communicator::scatter and gather: root's buffer holds every rank's chunk in rank order.
  void scatter(int rank, float* data, std::span<const std::size_t> counts, int root);
  void gather(int rank, float* data, std::span<const std::size_t> counts, int root);
  // Every rank's `count` floats of `mine` into each rank's `all`, in world rank order;
  // across processes each process's rank 0 exchanges its ranks' block. Not with shards.
  void allgather(int rank, const float* mine, float* all, std::size_t count);
  // Few values: every rank sums all of them, in rank order.
  void allreduce_host(int rank, std::span<double> data);

 private:
  template <typename Body>
  void collective(Body&& body);
  bool across() const { return processes_ != nullptr && processes_->count() > 1; }
  // Rank 0's part of a collective across processes: the world's sum of `count` floats
  // whose process's sum of `parts` is in `data` (an average: / the world's parts), and its
  // sum of squares.
  double exchange(float* data, std::size_t count, ReduceOp op, std::size_t parts);
  // Rank 0's: every process's `count` values (this one's from `mine`) into `into`, in
  // process order, and where each process's begin.
  template <typename T>
  std::vector<T*> from_every_process(const T* mine, std::size_t count, std::vector<T>& into);
  void refuse_across(const char* collective) const;

  const int size_;
  const std::shared_ptr<Processes> processes_;
  std::vector<float> exchanged_;         // rank 0's: every process's sums, in process order
  std::vector<double> host_exchanged_;   // likewise for allreduce_host
  std::vector<double> host_result_;      // allreduce_host's result across processes
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int waiting_ = 0;
  int inside_ = 0;  // ranks between the start and the end of a collective
  std::uint64_t generation_ = 0;
  bool aborted_ = false;
  // The current collective's buffer of each rank: set by that rank before the first
  // barrier; the others read it, and the allreduce writes its result chunks into it, only
  // between the first barrier and the last.
  std::vector<float*> buffers_;
  std::vector<const double*> host_buffers_;
  std::vector<const float*> sources_;  // allgather: each rank's `mine` and count, likewise
  std::vector<std::size_t> counts_;
  std::vector<double> squares_;  // allreduce: each rank's chunk's sum of squares, likewise
  // allreduce(): rank r's parts at parts_[first_part_[r] .. first_part_[r + 1]), in their
  // order, likewise; its result goes to buffers_[r], the last of them. A rank each when
  // the group has no shards; else as many as its shards.
  std::vector<std::size_t> first_part_;
  std::vector<float*> parts_;
};

}  // namespace mnist_mt::cpu
