#include "failures.hpp"

#include <algorithm>

namespace mnist_mt {
namespace {

bool is_aborted(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Aborted&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

Failures::Failures(int ranks, int first_rank, std::string host, std::function<void()> release)
    : ranks_(ranks), first_rank_(first_rank), host_(std::move(host)), release_(std::move(release)) {}

void Failures::fail(int rank, std::uint64_t step, std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    failures_.push_back({rank, step, std::move(error)});
  }
  cv_.notify_all();
  failed_.store(true);
  release_();
}

void Failures::await_peers() {
  std::unique_lock lock(mutex_);
  if (++ready_ == ranks_) cv_.notify_all();
  cv_.wait(lock, [&] { return ready_ >= ranks_ || !failures_.empty(); });
  if (ready_ < ranks_) throw Aborted("a peer failed while it set up");
}

void Failures::await_report() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !failures_.empty(); });
}

void Failures::rethrow() const {
  std::lock_guard lock(mutex_);
  if (failures_.empty()) return;
  const auto root =
      std::find_if(failures_.begin(), failures_.end(), [](const Failure& f) { return !is_aborted(f.error); });
  const Failure& f = root != failures_.end() ? *root : failures_.front();
  const auto where = [&](std::uint64_t step) {
    std::string rank = std::to_string(f.rank < 0 ? f.rank : first_rank_ + f.rank);
    if (!host_.empty()) rank += " (host " + host_ + ")";
    return "rank " + rank + " failed at step " + std::to_string(step) + ": ";
  };
  try {
    std::rethrow_exception(f.error);
  } catch (const ProcessesSilent& e) {
    throw RuntimeFailure(e.what());
  } catch (const StepFailure& e) {
    throw RuntimeFailure(where(e.step()) + e.what());
  } catch (const Interrupted&) {
    throw;
  } catch (const InputError& e) {
    throw InputError(where(f.step) + e.what());
  } catch (const std::exception& e) {
    throw RuntimeFailure(where(f.step) + e.what());
  } catch (...) {
    throw RuntimeFailure(where(f.step) + "unknown error");
  }
}

bool StopLine::stop_before(int rank, std::uint64_t step, bool requested) {
  std::lock_guard lock(mutex_);
  if (requested && stop_at_ == kNever) stop_at_ = *std::max_element(started_.begin(), started_.end());
  if (step >= stop_at_) return true;
  started_[static_cast<std::size_t>(rank)] = step + 1;
  return false;
}

}  // namespace mnist_mt
