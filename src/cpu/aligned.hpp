#pragma once
// Zeroed, 64-byte aligned arrays (cache lines, as oneDNN and the vector loops like them).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>

namespace mnist_mt::cpu {

struct AlignedFree {
  void operator()(void* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
template <class T>
using Aligned = std::unique_ptr<T[], AlignedFree>;
template <class T>
Aligned<T> aligned_zeros(std::size_t count) {
  void* p = ::operator new[](std::max<std::size_t>(count, 1) * sizeof(T), std::align_val_t{64});
  std::memset(p, 0, std::max<std::size_t>(count, 1) * sizeof(T));
  return Aligned<T>(static_cast<T*>(p));
}

}  // namespace mnist_mt::cpu
