#include "shared_loaders.hpp"

namespace mnist_mt {

LoaderOptions SharedLoaders::options(std::uint32_t epoch, bool train) const {
  LoaderOptions o;
  o.world = world_;
  o.first_rank = first_rank_;
  o.ranks = ranks_;
  o.batch = batch_;
  o.train = train;
  o.seed = seed_;
  o.epoch = epoch;
  return o;
}

SharedLoaders::Lease SharedLoaders::acquire(std::uint32_t epoch, bool train) {
  const std::pair key{epoch, train};
  std::lock_guard lock(mutex_);
  Entry& e = entries_[key];
  if (!e.loader) {
    e.loader = std::make_unique<Loader>(train ? data_.train : data_.test, options(epoch, train));
    if (cancelled_) e.loader->cancel();
  }
  return Lease(*this, key, *e.loader);
}

void SharedLoaders::cancel() {
  std::lock_guard lock(mutex_);
  cancelled_ = true;
  for (auto& [key, e] : entries_) {
    if (e.loader) e.loader->cancel();
  }
}

void SharedLoaders::release(std::pair<std::uint32_t, bool> key) noexcept {
  std::unique_ptr<Loader> last;
  {
    std::lock_guard lock(mutex_);
    const auto it = entries_.find(key);
    if (++it->second.released < ranks_) return;
    last = std::move(it->second.loader);
    entries_.erase(it);
  }
  // Joining the pipeline happens outside the lock, so cancel() never waits for it.
}

}  // namespace mnist_mt
