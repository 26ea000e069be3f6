#include "device_data.hpp"

#include <cstring>
#include <exception>
#include <iostream>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "errors.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cuda {
namespace {

// Left free beside a held split for the replicas' buffers and the libraries' workspaces
// made after it.
constexpr std::size_t kHeadroom = std::size_t{512} << 20;

struct Entry {
  int gpu;
  std::uint64_t fingerprint;
  std::uint32_t size;
  std::weak_ptr<const HeldSplit> held;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

// From pageable memory, which a cudaMemcpy may return from before its DMA ends: the
// stream's synchronisation is the end that other streams may rely on.
void upload(DeviceBuffer<std::uint8_t>& to, std::span<const std::uint8_t> from, cudaStream_t stream) {
  if (from.empty()) return;
  CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(), from.size(), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

// What hold_split keys a split's content by: FNV-1a's steps over its labels, then its
// images, 8 bytes at a time.
std::uint64_t split_fingerprint(Samples split) {
  std::uint64_t h = 14695981039346656037ull;
  const auto mix = [&h](std::span<const std::uint8_t> bytes) {
    std::size_t i = 0;
    for (; i + 8 <= bytes.size(); i += 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, bytes.data() + i, 8);
      h = (h ^ word) * 1099511628211ull;
    }
    for (; i < bytes.size(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  };
  mix(split.labels);
  mix(split.images);
  return h ^ split.labels.size();
}

}  // namespace

HeldSplit::HeldSplit(CudaDevice& device, Samples split)
    : images_(split.images.size()),
      labels_(split.labels.size()),
      size_(static_cast<std::uint32_t>(split.labels.size())) {
  upload(images_, split.images, device.compute());
  upload(labels_, split.labels, device.compute());
}

std::shared_ptr<const HeldSplit> hold_split(CudaDevice& device, Samples split) {
  const auto size = static_cast<std::uint32_t>(split.labels.size());
  if (size == 0 || split.images.size() != std::size_t{size} * kImageBytes) return nullptr;
  const std::uint64_t fingerprint = split_fingerprint(split);
  const std::lock_guard lock(registry_mutex());
  std::vector<Entry>& entries = registry();
  std::erase_if(entries, [](const Entry& e) { return e.held.expired(); });
  for (const Entry& e : entries) {
    if (e.gpu == device.id() && e.fingerprint == fingerprint && e.size == size) {
      if (auto held = e.held.lock()) return held;
    }
  }
  const std::size_t bytes = split.images.size() + split.labels.size();
  std::size_t free = 0, total = 0;
  device.activate();
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  std::string why;
  if (free < bytes + kHeadroom) {
    why = std::to_string(free >> 20) + " MiB free, " + std::to_string((bytes + kHeadroom) >> 20) + " MiB wanted";
  } else {
    try {
      auto held = std::make_shared<const HeldSplit>(device, split);
      entries.push_back({device.id(), fingerprint, size, held});
      return held;
    } catch (const std::exception& e) {
      (void)cudaGetLastError();  // an allocation's failure is not sticky: clear it
      why = e.what();
    }
  }
  std::cerr << "mnist_mt: warning: " << device.name() << ": a split of " << size
            << " images stays on the host, its batches copied each step (" << why << ")\n";
  return nullptr;
}

}  // namespace mnist_mt::cuda
