#pragma once
// Collectives among the ranks of one process (docs/architecture.md decision 1). Every call is
// enqueued on the calling rank's comm stream and returns at once; buffers are device
// buffers of that rank and must stay untouched until the comm stream passes the call.
// Every rank issues the same collectives in the same order.
#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include "mnist_mt/device.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual void allreduce(float* data, std::size_t count, ReduceOp op) = 0;
  // A rank that computes several shards of the world's batch in turn (Place::shards):
  // `shards` are its shards' buffers in shard order, as many as Place::shards gave it;
  // the result, as allreduce() in a world of a rank per shard computes it (an average
  // divides by the world's shards), lands in the last. Communicators made without
  // shards take one buffer.
  virtual void allreduce_shards(std::span<float* const> shards, std::size_t count, ReduceOp op) {
    if (shards.size() != 1)
      throw RuntimeFailure("an allreduce of " + std::to_string(shards.size()) +
                           " shards a rank: this communicator sums one buffer a rank");
    allreduce(shards[0], count, op);
  }
  virtual void broadcast(float* data, std::size_t count, int root) = 0;
  // The result lands in root's buffer only; other ranks' buffers are unchanged.
  virtual void reduce(float* data, std::size_t count, ReduceOp op, int root) = 0;
  // Rank r's chunk is counts[r] floats; every rank passes the same counts. Root's `data`
  // holds every chunk back to back in rank order. scatter: each other rank receives its
  // chunk into its own `data`; gather: each other rank's chunk (its `data`) lands in its
  // place in root's `data`. Root's own chunk stays where it is.
  virtual void scatter(float* data, std::span<const std::size_t> counts, int root) = 0;
  virtual void gather(float* data, std::span<const std::size_t> counts, int root) = 0;
  // Every rank's `count` floats of `mine`, in world rank order, into each rank's `all`
  // (count x size() floats; not overlapping `mine`). Communicators that gather nothing
  // this way (all but the CPU's, for now) throw.
  virtual void allgather(const float* /*mine*/, float* /*all*/, std::size_t /*count*/) {
    throw RuntimeFailure("this communicator has no allgather (--exchange factors runs on CPU devices)");
  }
  virtual void barrier() = 0;
  // Host values, synchronous: returns after every rank's values are summed into `data`.
  virtual void allreduce_host(std::span<double> data) = 0;

  // Once the comm stream has drained: the sum of squares of everything allreduce() wrote
  // since the last call (and reduce(), at its root), added in an order fixed by the
  // calls (the same bits on every rank), and reset; nullopt from a communicator that
  // does not keep it. A step's gradient norm comes from the reduction's own pass this way.
  virtual std::optional<double> take_reduced_squares() { return std::nullopt; }
  // Whether take_reduced_squares() gives a value: the reduction's pass doubles as the
  // norm's, so even a world of one rank runs it (CPU devices, where it runs on the comm
  // thread beside backward).
  virtual bool keeps_reduced_squares() const { return false; }

  // Callable from any thread, any number of times: releases every rank blocked in a
  // collective of this group, now or later; their streams fail with Aborted.
  virtual void abort() = 0;
};

// Communicator implementations: a scatter or gather names one chunk per rank.
inline void check_chunks(const Communicator& comm, std::span<const std::size_t> counts, int root) {
  if (counts.size() != static_cast<std::size_t>(comm.size()) || root < 0 || root >= comm.size())
    throw RuntimeFailure("scatter/gather of " + std::to_string(counts.size()) + " chunks from root " +
                         std::to_string(root) + " among " + std::to_string(comm.size()) + " ranks");
}

}  // namespace mnist_mt
