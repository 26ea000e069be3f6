#include "host_group.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "kernels.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {
namespace {

struct Chunk {
  std::size_t begin;
  std::size_t count;
};

// memcpy of floats; a no-op for none, whose pointers may be null.
void copy(float* to, const float* from, std::size_t count) {
  if (count > 0) std::memcpy(to, from, count * sizeof(float));
}

// Rank r's share of [0, count), in whole 64-byte lines so that two ranks rarely write
// one cache line.
Chunk chunk_of(std::size_t count, int rank, int world) {
  constexpr std::size_t kLine = 64 / sizeof(float);
  const std::size_t w = static_cast<std::size_t>(world);
  const std::size_t per = ((count + w - 1) / w + kLine - 1) / kLine * kLine;
  const std::size_t begin = std::min(count, per * static_cast<std::size_t>(rank));
  return {begin, std::min(count, begin + per) - begin};
}

double reduce_chunk(std::span<const float* const> in, Chunk chunk, std::span<float* const> out, ReduceOp op,
                    std::size_t world) {
  return reduce_in_order(in, chunk.begin, chunk.count, out, op, world);
}

}  // namespace

HostGroup::HostGroup(int size, std::shared_ptr<Processes> processes, std::vector<int> shards)
    : size_(size),
      processes_(std::move(processes)),
      buffers_(size),
      host_buffers_(size),
      sources_(size),
      counts_(size),
      squares_(size),
      first_part_(static_cast<std::size_t>(size) + 1, 0) {
  if (!shards.empty() && shards.size() != static_cast<std::size_t>(size))
    throw RuntimeFailure("shard counts for " + std::to_string(shards.size()) + " of " + std::to_string(size) +
                         " ranks");
  for (std::size_t r = 0; r < static_cast<std::size_t>(size); ++r) {
    const int k = shards.empty() ? 1 : shards[r];
    if (k < 1) throw RuntimeFailure("rank " + std::to_string(r) + " with " + std::to_string(k) + " shards");
    first_part_[r + 1] = first_part_[r] + static_cast<std::size_t>(k);
  }
  parts_.resize(first_part_.back());
}

void HostGroup::refuse_across(const char* collective) const {
  if (across()) throw RuntimeFailure(std::string(collective) + " between processes is not supported (--mode dp runs in one process)");
}

template <typename T>
std::vector<T*> HostGroup::from_every_process(const T* mine, std::size_t count, std::vector<T>& into) {
  const auto processes = static_cast<std::size_t>(processes_->count());
  into.resize(count * processes);
  processes_->allgather(mine, into.data(), count * sizeof(T), [this] { return aborted(); });
  std::vector<T*> parts(processes);
  for (std::size_t p = 0; p < processes; ++p) parts[p] = into.data() + count * p;
  return parts;
}

double HostGroup::exchange(float* data, std::size_t count, ReduceOp op, std::size_t parts) {
  return reduce_chunk(from_every_process(data, count, exchanged_), {0, count}, std::span(&data, 1), op,
                      parts * static_cast<std::size_t>(processes_->count()));
}

void HostGroup::barrier() {
  std::unique_lock lock(mutex_);
  if (aborted_) throw Aborted("collective aborted: a peer failed");
  const std::uint64_t generation = generation_;
  if (++waiting_ == size_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return aborted_ || generation_ != generation; });
  if (generation_ == generation) throw Aborted("collective aborted: a peer failed");
}

void HostGroup::world_barrier(int rank) {
  collective([&] {
    barrier();
    if (across() && rank == 0) {
      const char mine = 0;
      std::vector<char> all(static_cast<std::size_t>(processes_->count()));
      processes_->allgather(&mine, all.data(), 1, [this] { return aborted(); });
    }
    barrier();
  });
}

void HostGroup::abort() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
  }
  cv_.notify_all();
}

bool HostGroup::aborted() const {
  std::lock_guard lock(mutex_);
  return aborted_;
}

// Rank r sums chunk r of every part and writes the result into every rank's last part:
// a reduce-scatter whose results land where the all-gather would copy them, without its
// second pass over the data.
double HostGroup::allreduce(int rank, std::span<float* const> parts, std::size_t count, ReduceOp op) {
  const auto r = static_cast<std::size_t>(rank);
  const std::size_t first = first_part_[r], k = first_part_[r + 1] - first;
  const std::size_t all = parts_.size();
  double total = 0;
  collective([&] {
    // Inside, so that the peers are released.
    if (parts.size() != k)
      throw RuntimeFailure("rank " + std::to_string(rank) + ": an allreduce of " + std::to_string(parts.size()) +
                           (parts.size() == 1 ? " buffer" : " buffers") + " for its " + std::to_string(k) + " shards");
    std::copy(parts.begin(), parts.end(), parts_.begin() + static_cast<std::ptrdiff_t>(first));
    buffers_[rank] = parts.back();
    const std::span<float* const> in(parts_.data(), all);
    if (across()) {
      barrier();
      if (all > 1) reduce_chunk(in, chunk_of(count, rank, size_), std::span(&buffers_[0], 1), ReduceOp::kSum, 1);
      barrier();
      if (rank == 0) squares_[0] = exchange(buffers_[0], count, op, all);
      barrier();
      if (rank != 0) copy(buffers_[rank], buffers_[0], count);
      total = squares_[0];
      // No rank goes on (and rank 0 writes its buffer again) while a peer still copies.
      barrier();
      return;
    }
    barrier();
    if (all == 1) {  // the identity; the barrier still reports an abort
      total = sum_of_squares(parts[0], count);
      return;
    }
    squares_[rank] = reduce_chunk(in, chunk_of(count, rank, size_), buffers_, op, all);
    // Every chunk written: no rank reads a peer's buffer after this. squares_ is written
    // again only past the next collective's first barrier, which waits for this rank.
    barrier();
    for (int s = 0; s < size_; ++s) total += squares_[s];
  });
  return total;
}

// Across processes from world rank 0 only: each process's rank 0 receives it first.
void HostGroup::broadcast(int rank, float* data, std::size_t count, int root) {
  if (across() && root != 0)
    throw RuntimeFailure("a broadcast between processes from rank " + std::to_string(root) + ", not rank 0");
  collective([&] {
    if (across() && rank == 0) processes_->broadcast(data, count * sizeof(float), 0, [this] { return aborted(); });
    buffers_[rank] = data;
    barrier();
    if (rank != root) copy(data, buffers_[root], count);
    barrier();
  });
}

namespace {
std::size_t offset_of(std::span<const std::size_t> counts, int rank) {
  std::size_t at = 0;
  for (int r = 0; r < rank; ++r) at += counts[static_cast<std::size_t>(r)];
  return at;
}
}  // namespace

// Each rank copies its own chunk, from or into root's buffer, between the barriers.
void HostGroup::scatter(int rank, float* data, std::span<const std::size_t> counts, int root) {
  refuse_across("scatter");
  collective([&] {
    buffers_[rank] = data;
    barrier();
    if (rank != root) copy(data, buffers_[root] + offset_of(counts, rank), counts[static_cast<std::size_t>(rank)]);
    barrier();
  });
}

void HostGroup::gather(int rank, float* data, std::span<const std::size_t> counts, int root) {
  refuse_across("gather");
  collective([&] {
    buffers_[rank] = data;
    barrier();
    if (rank != root) copy(buffers_[root] + offset_of(counts, rank), data, counts[static_cast<std::size_t>(rank)]);
    barrier();
  });
}

// Each rank sums its chunk straight into root's buffer. Root's result: as allreduce's.
double HostGroup::reduce(int rank, float* data, std::size_t count, ReduceOp op, int root) {
  refuse_across("reduce");
  double total = 0;
  collective([&] {
    if (size_ == 1) {
      barrier();
      total = sum_of_squares(data, count);
      return;
    }
    buffers_[rank] = data;
    barrier();
    squares_[rank] =
        reduce_chunk(buffers_, chunk_of(count, rank, size_), std::span(&buffers_[root], 1), op, buffers_.size());
    barrier();
    // Read before root enters the next collective, the only one that writes squares_ again.
    if (rank == root) {
      for (int s = 0; s < size_; ++s) total += squares_[s];
    }
  });
  return total;
}

// Within a process each rank copies every peer's chunk. Across processes the ranks copy
// theirs into rank 0's `all` at their world place, rank 0 exchanges the process's block
// with every other process, and the others copy rank 0's result.
void HostGroup::allgather(int rank, const float* mine, float* all, std::size_t count) {
  collective([&] {
    // Inside, so that the peers are released.
    if (parts_.size() != static_cast<std::size_t>(size_))
      throw RuntimeFailure("rank " + std::to_string(rank) + ": an allgather in a group whose ranks compute several shards");
    sources_[rank] = mine;
    buffers_[rank] = all;
    counts_[rank] = count;
    barrier();
    for (int s = 0; s < size_; ++s)
      if (counts_[s] != count)
        throw RuntimeFailure("rank " + std::to_string(rank) + ": an allgather of " + std::to_string(count) +
                             " floats, rank " + std::to_string(s) + " gives " + std::to_string(counts_[s]));
    if (!across()) {
      for (int s = 0; s < size_; ++s) copy(all + count * static_cast<std::size_t>(s), sources_[s], count);
      barrier();  // no rank reuses its `mine` while a peer still reads it
      return;
    }
    const std::size_t block = count * static_cast<std::size_t>(size_);
    float* mine_in_all = buffers_[0] + block * static_cast<std::size_t>(processes_->index());
    copy(mine_in_all + count * static_cast<std::size_t>(rank), mine, count);
    barrier();
    if (rank == 0) {
      from_every_process(static_cast<const float*>(mine_in_all), block, exchanged_);
      copy(all, exchanged_.data(), exchanged_.size());
    }
    barrier();
    if (rank != 0) copy(all, buffers_[0], block * static_cast<std::size_t>(processes_->count()));
    barrier();  // rank 0 writes its `all` again only after every peer has read it
  });
}

namespace {
// The sum of `count` values at each of `in`, added in their order.
template <typename Pointer>
std::vector<double> sum_in_order(const std::vector<Pointer>& in, std::size_t count) {
  std::vector<double> sum(in[0], in[0] + count);
  for (std::size_t s = 1; s < in.size(); ++s) {
    for (std::size_t i = 0; i < count; ++i) sum[i] += in[s][i];
  }
  return sum;
}
}  // namespace

void HostGroup::allreduce_host(int rank, std::span<double> data) {
  collective([&] {
    host_buffers_[rank] = data.data();
    barrier();
    if (!across()) {
      const std::vector<double> sum = sum_in_order(host_buffers_, data.size());
      barrier();
      std::copy(sum.begin(), sum.end(), data.begin());
      return;
    }
    // Rank 0 adds the processes' sums; the others read the result after the barrier, and
    // rank 0 writes it again only past the next collective's first barrier.
    if (rank == 0) {
      const std::vector<double> mine = sum_in_order(host_buffers_, data.size());
      host_result_ = sum_in_order(from_every_process(mine.data(), data.size(), host_exchanged_), data.size());
    }
    barrier();
    std::copy(host_result_.begin(), host_result_.end(), data.begin());
  });
}

// One rank's part of a collective. A rank that leaves it early (released by an abort,
// or failing) aborts the group and then waits for every peer to leave too: until then
// a peer may still be reading or writing its buffer, which its owner frees next.
template <typename Body>
void HostGroup::collective(Body&& body) {
  {
    std::lock_guard lock(mutex_);
    ++inside_;
  }
  try {
    body();
  } catch (...) {
    std::unique_lock lock(mutex_);
    aborted_ = true;  // peers still in this collective could never complete it
    --inside_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return inside_ == 0; });
    throw;
  }
  std::lock_guard lock(mutex_);
  if (--inside_ == 0) cv_.notify_all();
}

}  // namespace mnist_mt::cpu
