#pragma once
// The ranks of one process meeting over host memory: an abortable barrier and the
// collectives built on it (DESIGN.md decisions 1 and 6). The CPU communicator runs them
// on its ranks' comm streams; the CUDA backend runs them on host threads for ranks that
// share a GPU, through pinned staging buffers.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "mnist_mt/communicator.hpp"

namespace mnist_mt::cpu {

// Every method but abort() runs on a thread of its rank, inside a collective that all
// ranks enter in the same order. Sums add each element in rank order 0..W-1 whatever the
// count or chunking, so results are bitwise reproducible; an average is that sum / W.
class HostGroup {
 public:
  explicit HostGroup(int size) : size_(size), buffers_(size), host_buffers_(size), squares_(size) {}
  int size() const { return size_; }

  void barrier();
  // Any thread: releases every rank waiting in a collective, now or later, with Aborted.
  void abort();
  bool aborted() const;

  // Returns the sum of squares of the result, the same bits on every rank: each rank's
  // chunk summed as it is reduced, the chunks' sums added in rank order.
  double allreduce(int rank, float* data, std::size_t count, ReduceOp op);
  void broadcast(int rank, float* data, std::size_t count, int root);
  // The result lands in root's buffer only; root gets its sum of squares as allreduce
  // does, the others 0.
  double reduce(int rank, float* data, std::size_t count, ReduceOp op, int root);
  // Communicator::scatter and gather: root's buffer holds every rank's chunk in rank order.
  void scatter(int rank, float* data, std::span<const std::size_t> counts, int root);
  void gather(int rank, float* data, std::span<const std::size_t> counts, int root);
  // Few values: every rank sums all of them, in rank order.
  void allreduce_host(int rank, std::span<double> data);

 private:
  template <typename Body>
  void collective(Body&& body);

  const int size_;
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
  std::vector<double*> host_buffers_;
  std::vector<double> squares_;  // allreduce: each rank's chunk's sum of squares, likewise
};

}  // namespace mnist_mt::cpu
