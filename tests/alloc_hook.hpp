#pragma once
// Replaces the global operator new/delete of the one test binary that includes this
// header (include it from a single file) to observe its allocations on every thread:
// how many there were, and the largest one since the last reset.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace alloc_hook {
inline std::atomic<std::uint64_t> count{0};
inline std::atomic<std::size_t> largest{0};

inline void* allocate(std::size_t size) noexcept {
  count.fetch_add(1, std::memory_order_relaxed);
  std::size_t seen = largest.load(std::memory_order_relaxed);
  while (size > seen && !largest.compare_exchange_weak(seen, size, std::memory_order_relaxed)) {
  }
  return std::malloc(size == 0 ? 1 : size);
}
inline void* allocate_or_throw(std::size_t size) {
  if (void* p = allocate(size)) return p;
  throw std::bad_alloc();
}
}  // namespace alloc_hook

void* operator new(std::size_t size) { return alloc_hook::allocate_or_throw(size); }
void* operator new[](std::size_t size) { return alloc_hook::allocate_or_throw(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return alloc_hook::allocate(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return alloc_hook::allocate(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
