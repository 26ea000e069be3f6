#pragma once
// The DDP workers' loaders: one Loader per (epoch, split) feeds every rank. The first
// rank to ask makes it; the last to let it go destroys it. No rank waits for another.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "mnist_mt/dataset.hpp"
#include "mnist_mt/loader.hpp"

namespace mnist_mt {

class SharedLoaders {
 public:
  // A rank's hold on one loader; lets it go when destroyed.
  class Lease {
   public:
    Lease(SharedLoaders& owner, std::pair<std::uint32_t, bool> key, Loader& loader)
        : owner_(&owner), key_(key), loader_(&loader) {}
    Lease(Lease&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)), key_(other.key_), loader_(other.loader_) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (owner_ != nullptr) owner_->release(key_);
    }
    Loader& loader() const { return *loader_; }

   private:
    SharedLoaders* owner_;
    std::pair<std::uint32_t, bool> key_;
    Loader* loader_;
  };

  // How a split is sharded: `world` shards of `batch` images; this process's are shards
  // first .. first + count - 1, which Loader::next() numbers from 0.
  struct Shards {
    std::uint32_t world = 1;
    std::uint32_t batch = 64;
    std::uint32_t first = 0;
    std::uint32_t count = 1;
  };
  // `consumers`: the ranks that acquire each loader (a rank may read several shards).
  SharedLoaders(const Dataset& data, Shards train, Shards test, std::uint64_t seed, std::uint32_t consumers)
      : data_(data), train_(train), test_(test), seed_(seed), consumers_(consumers) {}

  Lease acquire(std::uint32_t epoch, bool train);
  // What the loader of (epoch, split) is made with.
  LoaderOptions options(std::uint32_t epoch, bool train) const;
  // Cancels every loader, now and any made later: ranks blocked in next() get nullptr.
  void cancel();

 private:
  struct Entry {
    std::unique_ptr<Loader> loader;
    std::uint32_t released = 0;
  };
  void release(std::pair<std::uint32_t, bool> key) noexcept;

  const Dataset& data_;
  const Shards train_, test_;
  const std::uint64_t seed_;
  const std::uint32_t consumers_;
  std::mutex mutex_;
  std::map<std::pair<std::uint32_t, bool>, Entry> entries_;
  bool cancelled_ = false;
};

}  // namespace mnist_mt
