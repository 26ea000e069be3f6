#include "shared_loaders.hpp"

namespace mnist_mt {

LoaderOptions SharedLoaders::options(std::uint32_t epoch, bool train) const {
  const Shards& shards = train ? train_ : test_;
  LoaderOptions o;
  o.world = shards.world;
  o.first_rank = shards.first;
  o.ranks = shards.count;
  o.batch = shards.batch;
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
    if (++it->second.released < consumers_) return;
    last = std::move(it->second.loader);
    entries_.erase(it);
  }
  // Joining the pipeline happens outside the lock, so cancel() never waits for it.
}

}  // namespace mnist_mt
