#include "mnist_mt/local_group.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

enum class Kind { kAllreduce, kBroadcast, kReduce, kScatter, kGather, kBarrier, kHost };

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kAllreduce: return "allreduce";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kReduce: return "reduce";
    case Kind::kScatter: return "scatter";
    case Kind::kGather: return "gather";
    case Kind::kBarrier: return "barrier";
    case Kind::kHost: return "allreduce_host";
  }
  return "collective";
}

// One rank's part of a collective: what every rank passes alike, and its own buffers.
struct Call {
  Call() = default;
  Call(Kind kind, std::size_t count, ReduceOp op = ReduceOp::kSum, int root = 0)
      : kind(kind), count(count), op(op), root(root) {}

  Kind kind = Kind::kBarrier;
  std::size_t count = 0;  // floats, or doubles for kHost
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<std::size_t> counts;  // scatter, gather: each rank's chunk
  std::vector<float*> buffers;      // allreduce: the rank's parts; otherwise its buffer
  double* host = nullptr;

  bool alike(const Call& other) const {
    return kind == other.kind && count == other.count && op == other.op && root == other.root &&
           counts == other.counts;
  }
  std::string text() const {
    return std::string(kind_name(kind)) + " of " + std::to_string(count) + (kind == Kind::kHost ? " doubles" : " floats") +
           (kind == Kind::kBroadcast || kind == Kind::kReduce || kind == Kind::kScatter || kind == Kind::kGather
                ? " from root " + std::to_string(root)
                : "");
  }
};

class LocalGroup;

// A call made inside a bracket, completed by local_group_end().
struct Pending {
  std::shared_ptr<LocalGroup> group;
  int rank;
  std::uint64_t number;
};
thread_local int bracket_depth = 0;
thread_local std::vector<Pending> bracket_calls;

class LocalGroup : public std::enable_shared_from_this<LocalGroup> {
 public:
  LocalGroup(std::vector<Device*> devices, std::vector<int> shards)
      : devices_(std::move(devices)), next_(devices_.size(), 0), pools_(devices_.size()) {
    if (!shards.empty() && shards.size() != devices_.size())
      throw RuntimeFailure("shard counts for " + std::to_string(shards.size()) + " of " +
                           std::to_string(devices_.size()) + " ranks");
    for (std::size_t r = 0; r < devices_.size(); ++r) {
      const int k = shards.empty() ? 1 : shards[r];
      if (k < 1) throw RuntimeFailure("rank " + std::to_string(r) + " with " + std::to_string(k) + " shards");
      parts_.push_back(static_cast<std::size_t>(k));
    }
  }

  int size() const { return static_cast<int>(devices_.size()); }
  std::size_t parts(int rank) const { return parts_[static_cast<std::size_t>(rank)]; }

  // Rank `rank`'s next collective: see local_group.hpp.
  // A rank that fails inside (a device error, a mismatched call) aborts the group: its
  // peers could never complete the collective.
  void call(int rank, Call c) {
    std::unique_lock lock(mutex_);
    throw_if_aborted(rank);
    aborting_on_failure([&] { arrive(lock, rank, std::move(c)); });
  }

  // Waits, abortably, until collective `number` has been enqueued by its last rank, then
  // orders `rank`'s comm stream after it.
  void finish(int rank, std::uint64_t number) {
    std::unique_lock lock(mutex_);
    aborting_on_failure([&] { finish_locked(lock, rank, number); });
  }

  void abort() {
    const std::lock_guard lock(mutex_);
    abort_locked();
  }

 private:
  template <typename Body>
  void aborting_on_failure(Body&& body) {
    try {
      body();
    } catch (...) {
      abort_locked();
      throw;
    }
  }

  void arrive(std::unique_lock<std::mutex>& lock, int rank, Call c) {
    Device& device = *devices_[static_cast<std::size_t>(rank)];
    std::unique_ptr<DeviceEvent> arrival = take_event(rank);
    device.record(Lane::kComm, *arrival);
    const std::uint64_t number = next_[static_cast<std::size_t>(rank)]++;
    Slot& s = slot(number);
    for (const std::optional<Call>& peer : s.calls) {
      if (peer && !peer->alike(c)) {
        const std::string why = device.name() + " rank " + std::to_string(rank) + ": collective " +
                                std::to_string(number) + " is " + c.text() + " where a peer's is " + peer->text() +
                                "; the group was aborted";
        abort_locked();
        throw RuntimeFailure(why);
      }
    }
    s.calls[static_cast<std::size_t>(rank)] = std::move(c);
    s.arrived[static_cast<std::size_t>(rank)] = std::move(arrival);
    if (++s.arrivals == size()) {  // the last: enqueues the collective for every rank
      run(s, rank);
      s.ready = true;
      cv_.notify_all();
      pick_up(number, rank);
    } else if (bracket_depth > 0) {
      bracket_calls.push_back({shared_from_this(), rank, number});
    } else {
      finish_locked(lock, rank, number);
    }
  }

  struct Slot {
    explicit Slot(std::size_t ranks) : calls(ranks), arrived(ranks) {}
    std::vector<std::optional<Call>> calls;
    std::vector<std::unique_ptr<DeviceEvent>> arrived;
    std::unique_ptr<DeviceEvent> done;  // recorded on rank `last`'s comm stream
    int last = -1;
    int arrivals = 0;
    int picked_up = 0;
    bool ready = false;
    std::vector<double> host_sum;
  };

  void abort_locked() {
    aborted_ = true;
    cv_.notify_all();
  }

  void throw_if_aborted(int rank) const {
    if (aborted_)
      throw Aborted(devices_[static_cast<std::size_t>(rank)]->name() + " rank " + std::to_string(rank) +
                    ": collective released, the group was aborted");
  }

  // Slots live from their first arrival to their last pick-up; numbers are consecutive.
  Slot& slot(std::uint64_t number) {
    while (first_ + slots_.size() <= number) slots_.emplace_back(devices_.size());
    return slots_[static_cast<std::size_t>(number - first_)];
  }

  std::unique_ptr<DeviceEvent> take_event(int rank) {
    auto& pool = pools_[static_cast<std::size_t>(rank)];
    if (pool.empty()) return devices_[static_cast<std::size_t>(rank)]->make_event();
    std::unique_ptr<DeviceEvent> e = std::move(pool.back());
    pool.pop_back();
    return e;
  }

  void finish_locked(std::unique_lock<std::mutex>& lock, int rank, std::uint64_t number) {
    cv_.wait(lock, [&] { return aborted_ || slot(number).ready; });
    throw_if_aborted(rank);
    pick_up(number, rank);
  }

  // Rank `last`, the last to arrive: its comm stream waits for every peer's arrival, runs
  // the operation, and records the completion.
  void run(Slot& s, int last) {
    Device& device = *devices_[static_cast<std::size_t>(last)];
    for (int r = 0; r < size(); ++r) {
      if (r != last) device.wait_for(Lane::kComm, *s.arrived[static_cast<std::size_t>(r)]);
    }
    const Call& c = *s.calls[static_cast<std::size_t>(last)];
    const auto buffer = [&](int r) { return s.calls[static_cast<std::size_t>(r)]->buffers.back(); };
    std::vector<const float*> in;
    std::vector<float*> out;
    switch (c.kind) {
      case Kind::kAllreduce:
        for (const auto& call : s.calls) {
          in.insert(in.end(), call->buffers.begin(), call->buffers.end());
          out.push_back(call->buffers.back());
        }
        if (in.size() > 1 && c.count > 0) device.reduce(Lane::kComm, in, out, c.count, c.op, in.size());
        break;
      case Kind::kReduce:
        for (int r = 0; r < size(); ++r) in.push_back(buffer(r));
        out.push_back(buffer(c.root));
        if (in.size() > 1 && c.count > 0) device.reduce(Lane::kComm, in, out, c.count, c.op, in.size());
        break;
      case Kind::kBroadcast:
        for (int r = 0; r < size(); ++r) {
          if (r != c.root) device.copy(Lane::kComm, buffer(r), buffer(c.root), c.count);
        }
        break;
      case Kind::kScatter:
      case Kind::kGather: {
        std::size_t at = 0;
        for (int r = 0; r < size(); ++r) {
          const std::size_t n = c.counts[static_cast<std::size_t>(r)];
          if (r != c.root) {
            float* chunk = buffer(c.root) + at;
            if (c.kind == Kind::kScatter)
              device.copy(Lane::kComm, buffer(r), chunk, n);
            else
              device.copy(Lane::kComm, chunk, buffer(r), n);
          }
          at += n;
        }
        break;
      }
      case Kind::kHost:  // host values, summed in rank order here
        s.host_sum.assign(s.calls[0]->host, s.calls[0]->host + c.count);
        for (int r = 1; r < size(); ++r) {
          const double* x = s.calls[static_cast<std::size_t>(r)]->host;
          for (std::size_t i = 0; i < c.count; ++i) s.host_sum[i] += x[i];
        }
        break;
      case Kind::kBarrier:
        break;
    }
    s.done = take_event(last);
    device.record(Lane::kComm, *s.done);
    s.last = last;
  }

  void pick_up(std::uint64_t number, int rank) {
    Slot& s = slot(number);
    if (rank != s.last) devices_[static_cast<std::size_t>(rank)]->wait_for(Lane::kComm, *s.done);
    const Call& mine = *s.calls[static_cast<std::size_t>(rank)];
    if (mine.kind == Kind::kHost) std::copy(s.host_sum.begin(), s.host_sum.end(), mine.host);
    ++s.picked_up;
    // Every wait naming the front slots' events is enqueued: their events can be recorded
    // again.
    while (!slots_.empty() && slots_.front().picked_up == size()) {
      Slot& front = slots_.front();
      for (std::size_t r = 0; r < front.arrived.size(); ++r) pools_[r].push_back(std::move(front.arrived[r]));
      pools_[static_cast<std::size_t>(front.last)].push_back(std::move(front.done));
      slots_.pop_front();
      ++first_;
    }
  }

  const std::vector<Device*> devices_;
  std::vector<std::size_t> parts_;  // each rank's allreduce buffers
  std::mutex mutex_;
  std::condition_variable cv_;
  bool aborted_ = false;
  std::vector<std::uint64_t> next_;  // each rank's next collective number
  std::deque<Slot> slots_;           // collectives first_, first_ + 1, ...
  std::uint64_t first_ = 0;
  // Each rank's events, made by its device, free to record again.
  std::vector<std::vector<std::unique_ptr<DeviceEvent>>> pools_;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  void allreduce(float* data, std::size_t count, ReduceOp op) override {
    allreduce_shards(std::span(&data, 1), count, op);
  }
  void allreduce_shards(std::span<float* const> shards, std::size_t count, ReduceOp op) override {
    if (shards.size() != group_->parts(rank_))
      throw RuntimeFailure("rank " + std::to_string(rank_) + ": an allreduce of " + std::to_string(shards.size()) +
                           " buffers for its " + std::to_string(group_->parts(rank_)) + " shards");
    Call c{Kind::kAllreduce, count, op};
    c.buffers.assign(shards.begin(), shards.end());
    group_->call(rank_, std::move(c));
  }
  void broadcast(float* data, std::size_t count, int root) override { rooted(Kind::kBroadcast, data, count, root); }
  void reduce(float* data, std::size_t count, ReduceOp op, int root) override {
    check_root(root);
    Call c{Kind::kReduce, count, op, root};
    c.buffers = {data};
    group_->call(rank_, std::move(c));
  }
  void scatter(float* data, std::span<const std::size_t> counts, int root) override {
    chunked(Kind::kScatter, data, counts, root);
  }
  void gather(float* data, std::span<const std::size_t> counts, int root) override {
    chunked(Kind::kGather, data, counts, root);
  }
  void barrier() override { group_->call(rank_, Call{}); }
  void allreduce_host(std::span<double> data) override {
    Call c{Kind::kHost, data.size()};
    c.host = data.data();
    group_->call(rank_, std::move(c));
  }
  void abort() override { group_->abort(); }

 private:
  void check_root(int root) const {
    if (root < 0 || root >= size())
      throw RuntimeFailure("a collective from root " + std::to_string(root) + " among " + std::to_string(size()) +
                           " ranks");
  }
  void rooted(Kind kind, float* data, std::size_t count, int root) {
    check_root(root);
    Call c{kind, count, ReduceOp::kSum, root};
    c.buffers = {data};
    group_->call(rank_, std::move(c));
  }
  void chunked(Kind kind, float* data, std::span<const std::size_t> counts, int root) {
    check_chunks(*this, counts, root);
    std::size_t total = 0;
    for (const std::size_t n : counts) total += n;
    Call c{kind, total, ReduceOp::kSum, root};
    c.counts.assign(counts.begin(), counts.end());
    c.buffers = {data};
    group_->call(rank_, std::move(c));
  }

  std::shared_ptr<LocalGroup> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_communicators(std::span<Device* const> devices,
                                                                    std::vector<int> shards) {
  auto group = std::make_shared<LocalGroup>(std::vector<Device*>(devices.begin(), devices.end()), std::move(shards));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < group->size(); ++r) comms.push_back(std::make_unique<LocalCommunicator>(group, r));
  return comms;
}

void local_group_start() { ++bracket_depth; }

void local_group_end() {
  if (bracket_depth == 0) throw RuntimeFailure("local_group_end() without local_group_start()");
  if (--bracket_depth > 0) return;
  std::vector<Pending> calls = std::exchange(bracket_calls, {});
  std::exception_ptr first;
  for (const Pending& p : calls) {
    try {
      p.group->finish(p.rank, p.number);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace mnist_mt
