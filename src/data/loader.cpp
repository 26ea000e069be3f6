#include "mnist_mt/loader.hpp"

#include <oneapi/tbb/parallel_pipeline.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "mnist_mt/error.hpp"
#include "mnist_mt/sampler.hpp"

namespace mnist_mt {
namespace {

// A buffer slot's life: free -> filling (gather stage) -> ready (handed off) -> free
// (recycled by its consumer's following next()).
enum SlotState : std::uint32_t { kFree, kFilling, kReady };

// Each queued batch pins a buffer per rank; a deeper queue only costs memory.
constexpr std::uint32_t kMaxDepth = 1024;

// Pipeline items in flight: enough to keep every thread gathering, bounded because each
// one pins buffers.
std::uint32_t live_tokens() {
  return static_cast<std::uint32_t>(std::clamp(tbb::this_task_arena::max_concurrency() + 1, 2, 8));
}

// Images one pipeline item gathers at least, over all ranks: small batches are grouped
// into items of several steps, so that the per-item costs (scheduling, the hand-off's
// lock and wake-up) stay small beside the copying.
constexpr std::uint32_t kItemImages = 512;
constexpr std::uint32_t kMaxStepsPerItem = 4;

std::uint32_t steps_per_item(std::uint32_t world, std::uint32_t batch) {
  const std::uint64_t per_step = std::uint64_t{world} * batch;
  const std::uint64_t steps = (kItemImages + per_step - 1) / per_step;
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(steps, 1, kMaxStepsPerItem));
}

// Options whose ranks 0 means "every rank from first_rank on".
LoaderOptions with_ranks(LoaderOptions options) {
  if (options.ranks == 0 && options.first_rank < options.world) options.ranks = options.world - options.first_rank;
  return options;
}

}  // namespace

struct Loader::State {
  // One rank's buffers and bounded queue. Steps are pushed and popped in order, so the
  // queue is two counters, and step s always lives in slot s % pool.
  struct Rank {
    std::mutex mutex;
    std::condition_variable ready;  // consumer: a batch was pushed, or the loader stopped
    std::condition_variable space;  // hand-off stage: the queue has room, or the loader stopped
    std::uint32_t pushed = 0;       // guarded by mutex
    std::uint32_t popped = 0;       // guarded by mutex
    bool holding = false;           // the consumer holds slot (popped - 1) % pool
    std::vector<Batch> slots;
    std::vector<std::atomic<std::uint32_t>> slot_state;
  };

  State(const Split& split_in, const LoaderOptions& options_in, std::function<void(std::uint32_t)> before_gather_in);
  void run() noexcept;
  void gather(std::uint32_t step);
  void hand_off(std::uint32_t first, std::uint32_t last);
  const Batch* next(std::uint32_t rank);
  void fail(std::exception_ptr error) noexcept;
  void cancel() noexcept;
  void wake_all() noexcept;
  // Runs a stage body. An error stops the loader at once and reaches the consumers
  // without waiting for the pipeline to drain. oneTBB's scheduler is not instrumented
  // for ThreadSanitizer, so the ordering it provides between stages is invisible to it:
  // the acquire on entry and the release on exit state that ordering in the open.
  template <class Body>
  void stage(Body body) noexcept {
    (void)handover.load(std::memory_order_acquire);
    try {
      body();
    } catch (...) {
      fail(std::current_exception());
    }
    handover.fetch_add(1, std::memory_order_release);
  }

  const Split& split;
  const LoaderOptions options;
  const std::function<void(std::uint32_t)> before_gather;  // tests only (loader_testing.hpp); empty otherwise
  ShardPlan plan;
  std::vector<std::uint32_t> order;  // the epoch's permutation; empty in evaluation (split order)
  std::uint32_t tokens;
  std::uint32_t group = 1;  // steps per pipeline item
  // Slots per rank: the steps of the items in flight + queue depth + the one the consumer holds.
  std::uint32_t pool = 0;
  std::vector<Rank> ranks;

  std::uint32_t next_step = 0;  // the input stage's; stages run one at a time
  std::atomic<std::uint32_t> handover{0};
  std::atomic<bool> stopped{false};   // cancelled or failed: no more batches
  std::atomic<bool> finished{false};  // the pipeline has returned
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;  // the first error, guarded by error_mutex
  tbb::task_group_context context;
  std::thread thread;
};

Loader::State::State(const Split& split_in, const LoaderOptions& options_in,
                     std::function<void(std::uint32_t)> before_gather_in)
    : split(split_in), options(with_ranks(options_in)), before_gather(std::move(before_gather_in)), tokens(live_tokens()) {
  if (options.world == 0 || options.batch == 0 || options.depth == 0 || options.depth > kMaxDepth)
    throw InputError("loader: world size and batch size must be positive, queue depth 1.." +
                     std::to_string(kMaxDepth));
  if (options.first_rank >= options.world || options.ranks > options.world - options.first_rank)
    throw InputError("loader: ranks " + std::to_string(options.first_rank) + ".." +
                     std::to_string(options.first_rank + options.ranks) + " of a world of " +
                     std::to_string(options.world));
  if (split.images.size() != std::size_t{split.size()} * kImageBytes)
    throw InputError("loader: the split has " + std::to_string(split.size()) + " labels but " +
                     std::to_string(split.images.size()) + " image bytes");
  group = steps_per_item(options.ranks, options.batch);
  pool = tokens * group + options.depth + 1;
  plan = ShardPlan{split.size(), options.world, options.batch, options.train};
  if (options.train) order = epoch_permutation(options.seed, options.epoch, split.size());
  ranks = std::vector<Rank>(options.ranks);
  for (Rank& rank : ranks) {
    rank.slots.resize(pool);
    rank.slot_state = std::vector<std::atomic<std::uint32_t>>(pool);
    for (Batch& b : rank.slots) {
      b.epoch = options.epoch;
      b.split_images = split.images.data();
      b.images.resize(std::size_t{options.batch} * kImageBytes);
      b.labels.resize(options.batch);
      b.indices.resize(options.batch);
    }
  }
}

void Loader::State::run() noexcept {
  try {
    const std::uint32_t steps = plan.steps();
    // A pipeline item is named by its first step and covers up to `group` steps.
    const auto next_item = [&](tbb::flow_control& fc) {
      std::uint32_t first = 0;
      stage([&] {
        first = next_step;
        next_step += group;
        if (first >= steps || stopped.load()) fc.stop();
      });
      return first;
    };
    const auto gather_item = [&](std::uint32_t first) {
      stage([&] {
        for (std::uint32_t step = first; step < std::min(first + group, steps); ++step) gather(step);
      });
      return first;
    };
    const auto hand_off_item = [&](std::uint32_t first) {
      stage([&] { hand_off(first, std::min(first + group, steps)); });
    };
    handover.fetch_add(1, std::memory_order_release);
    // Isolated, so that while waiting this thread never picks up unrelated tasks (a
    // consumer's, say) that could block on this very loader.
    using tbb::filter_mode;
    tbb::this_task_arena::isolate([&] {
      tbb::parallel_pipeline(tokens,
                             tbb::make_filter<void, std::uint32_t>(filter_mode::serial_in_order, next_item) &
                                 tbb::make_filter<std::uint32_t, std::uint32_t>(filter_mode::parallel, gather_item) &
                                 tbb::make_filter<std::uint32_t, void>(filter_mode::serial_in_order, hand_off_item),
                             context);
    });
    (void)handover.load(std::memory_order_acquire);
  } catch (...) {
    fail(std::current_exception());
  }
  finished.store(true);
  wake_all();
}

void Loader::State::gather(std::uint32_t step) {
  if (before_gather) before_gather(step);
  if (stopped.load(std::memory_order_relaxed)) return;  // hand_off will not deliver it
  const std::uint32_t slot = step % pool;
  for (std::uint32_t r = 0; r < options.ranks; ++r) {
    Rank& rank = ranks[r];
    std::uint32_t expected = kFree;
    // Acquire: the consumer has finished reading the batch this slot held before.
    if (!rank.slot_state[slot].compare_exchange_strong(expected, kFilling, std::memory_order_acquire))
      throw RuntimeFailure("loader: rank " + std::to_string(r) + "'s buffer for step " + std::to_string(step) +
                           " is still in use");
    Batch& batch = rank.slots[slot];
    batch.step = step;
    batch.size = plan.shard(options.first_rank + r, step, batch.indices);
    for (std::uint32_t i = 0; i < batch.size; ++i) {
      const std::uint32_t index = order.empty() ? batch.indices[i] : order[batch.indices[i]];
      batch.indices[i] = index;
      batch.labels[i] = split.labels[index];
      std::memcpy(batch.images.data() + std::size_t{i} * kImageBytes, split.image(index), kImageBytes);
    }
    rank.slot_state[slot].store(kReady, std::memory_order_release);
  }
}

// Queues steps [first, last), step by step across the ranks, as a single consumer may take
// the ranks in turn. Consumers are woken once per item, and before any wait on a full queue.
void Loader::State::hand_off(std::uint32_t first, std::uint32_t last) {
  const auto wake_consumers = [this] {
    for (Rank& rank : ranks) rank.ready.notify_one();
  };
  for (std::uint32_t step = first; step < last; ++step) {
    for (Rank& rank : ranks) {
      std::unique_lock lock(rank.mutex);
      if (rank.pushed != step)
        throw RuntimeFailure("loader: step " + std::to_string(step) + " handed off out of order");
      if (rank.pushed - rank.popped >= options.depth) {
        lock.unlock();
        wake_consumers();
        lock.lock();
        rank.space.wait(lock, [&] { return rank.pushed - rank.popped < options.depth || stopped.load(); });
      }
      if (stopped.load()) return;
      ++rank.pushed;
    }
  }
  wake_consumers();
}

const Batch* Loader::State::next(std::uint32_t r) {
  if (r >= options.ranks) throw std::out_of_range("Loader::next: rank " + std::to_string(r) + " out of range");
  Rank& rank = ranks[r];
  std::unique_lock lock(rank.mutex);
  if (rank.holding) {
    // Release: the gather stage may refill the slot only after this consumer is done with it.
    rank.slot_state[(rank.popped - 1) % pool].store(kFree, std::memory_order_release);
    rank.holding = false;
  }
  rank.ready.wait(lock, [&] { return rank.pushed != rank.popped || stopped.load() || finished.load(); });
  if (failed.load()) {
    lock.unlock();
    std::exception_ptr e;
    {
      const std::lock_guard error_lock(error_mutex);
      e = error;
    }
    std::rethrow_exception(e);
  }
  if (stopped.load() || rank.pushed == rank.popped) return nullptr;
  const bool was_full = rank.pushed - rank.popped == options.depth;
  const std::uint32_t slot = rank.popped % pool;
  ++rank.popped;
  rank.holding = true;
  lock.unlock();
  if (was_full) rank.space.notify_one();
  // Acquire: pairs with the gather stage's release, so the batch's contents are visible.
  if (rank.slot_state[slot].load(std::memory_order_acquire) != kReady)
    throw RuntimeFailure("loader: rank " + std::to_string(r) + " popped a batch that is not ready");
  return &rank.slots[slot];
}

void Loader::State::fail(std::exception_ptr e) noexcept {
  {
    const std::lock_guard lock(error_mutex);
    if (!error) error = std::move(e);
  }
  failed.store(true);
  cancel();
}

void Loader::State::cancel() noexcept {
  stopped.store(true);
  // A pipeline that has returned has nothing left to cancel. Skipping it also keeps
  // ThreadSanitizer from seeing a race with libtbb's (uninstrumented) context setup.
  if (!finished.load()) context.cancel_group_execution();
  wake_all();
}

// Taking each rank's mutex between changing a flag and notifying means no waiter can
// miss the change.
void Loader::State::wake_all() noexcept {
  for (Rank& rank : ranks) {
    { const std::lock_guard lock(rank.mutex); }
    rank.ready.notify_all();
    rank.space.notify_all();
  }
}

Loader::Loader(const Split& split, const LoaderOptions& options) : Loader(split, options, {}) {}

Loader::Loader(const Split& split, const LoaderOptions& options, std::function<void(std::uint32_t)> before_gather)
    : state_(std::make_unique<State>(split, options, std::move(before_gather))) {
  state_->thread = std::thread([state = state_.get()] { state->run(); });
}

Loader::~Loader() {
  cancel();
  try {
    if (state_->thread.joinable()) state_->thread.join();
  } catch (...) {
    // join only fails on a broken thread handle; nothing left to recover in a destructor
  }
}

std::uint32_t Loader::steps() const { return state_->plan.steps(); }

std::vector<std::uint32_t> Loader::rank_samples(std::uint32_t rank, std::uint32_t first) const {
  const State& s = *state_;
  if (rank >= s.options.ranks)
    throw std::out_of_range("Loader::rank_samples: rank " + std::to_string(rank) + " out of range");
  std::vector<std::uint32_t> samples, positions(s.options.batch);
  for (std::uint32_t step = first; step < s.plan.steps(); ++step) {
    const std::uint32_t n = s.plan.shard(s.options.first_rank + rank, step, positions);
    for (std::uint32_t i = 0; i < n; ++i) samples.push_back(s.order.empty() ? positions[i] : s.order[positions[i]]);
  }
  return samples;
}

const std::uint8_t* Loader::split_images() const { return state_->split.images.data(); }

const Batch* Loader::next(std::uint32_t rank) { return state_->next(rank); }

void Loader::cancel() { state_->cancel(); }

}  // namespace mnist_mt
