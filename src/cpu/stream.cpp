#include "stream.hpp"

#include <algorithm>
#include <utility>

#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {

Stream::Stream(std::string name, std::function<void()> on_start)
    : name_(std::move(name)), thread_([this, f = std::move(on_start)]() mutable { run(std::move(f)); }) {}

Stream::~Stream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

std::uint64_t Stream::enqueue(std::function<void()> task, bool even_after_error) {
  std::uint64_t t;
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({std::move(task), even_after_error});
    t = ++enqueued_;
  }
  work_cv_.notify_one();
  return t;
}

std::uint64_t Stream::ticket() const {
  std::lock_guard lock(mutex_);
  return enqueued_;
}

bool Stream::passed(std::uint64_t ticket) const {
  std::lock_guard lock(mutex_);
  return completed_ >= ticket;
}

std::exception_ptr Stream::wait_quiet(std::uint64_t ticket) {
  std::unique_lock lock(mutex_);
  while (completed_ < ticket) {
    wake_at_ = std::min(wake_at_, ticket);
    done_cv_.wait(lock);
  }
  return error_;
}

void Stream::wait(std::uint64_t ticket) {
  if (auto error = wait_quiet(ticket)) std::rethrow_exception(error);
}

void Stream::enqueue_wait(Stream& other, std::uint64_t ticket) {
  enqueue([&other, ticket] {
    if (other.wait_quiet(ticket)) throw Aborted(other.name() + " failed earlier");
  });
}

void Stream::run(std::function<void()> on_start) {
  if (on_start) on_start();
  for (;;) {
    Task task;
    bool skip;
    {
      std::unique_lock lock(mutex_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      skip = error_ != nullptr && !task.even_after_error;
    }
    std::exception_ptr error;
    if (!skip) {
      try {
        task.run();
      } catch (...) {
        error = std::current_exception();
      }
    }
    task.run = nullptr;  // release captures before the task counts as complete
    bool wake;
    {
      std::lock_guard lock(mutex_);
      if (error && !error_) error_ = error;
      wake = ++completed_ >= wake_at_;
      if (wake) wake_at_ = kNobody;  // those still short of their ticket ask again
    }
    if (wake) done_cv_.notify_all();
  }
}

}  // namespace mnist_mt::cpu
