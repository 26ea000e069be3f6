#pragma once
// An in-order queue of work run by a thread of its own: the CPU twin of a CUDA stream
// (docs/architecture.md decision 2). Tasks are numbered; a ticket is the number of tasks enqueued
// so far, and waiting for a ticket is the CPU twin of waiting for a CUDA event.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>

namespace mnist_mt::cpu {

class Stream {
 public:
  // `on_start` runs first on the stream's thread (e.g. to pin the oneDNN thread count).
  explicit Stream(std::string name, std::function<void()> on_start = {});
  ~Stream();  // drains the queue, then joins; never throws
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Returns the new task's ticket. Once a task has thrown, later tasks are skipped (but
  // still complete, so no waiter hangs) and the first error is kept; a task enqueued
  // with `even_after_error` (teardown on the stream's own thread) still runs.
  std::uint64_t enqueue(std::function<void()> task, bool even_after_error = false);
  std::uint64_t ticket() const;
  // Blocks until task `ticket` has completed; rethrows the stream's first error.
  void wait(std::uint64_t ticket);
  // Enqueues a task that blocks until `other` has completed `ticket`; an error on
  // `other` fails this stream too.
  void enqueue_wait(Stream& other, std::uint64_t ticket);
  void synchronize() { wait(ticket()); }
  // Whether task `ticket` has completed; never blocks.
  bool passed(std::uint64_t ticket) const;
  // As wait(), without rethrowing: returns the stream's first error, if any.
  std::exception_ptr wait_quiet(std::uint64_t ticket);
  const std::string& name() const { return name_; }

 private:
  void run(std::function<void()> on_start);

  std::string name_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  struct Task {
    std::function<void()> run;
    bool even_after_error;
  };
  std::deque<Task> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  // The lowest ticket a waiter waits for: a task wakes the waiters only once it completes
  // that one, not after every task (the comm stream waits while compute runs a dozen).
  static constexpr std::uint64_t kNobody = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t wake_at_ = kNobody;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace mnist_mt::cpu
