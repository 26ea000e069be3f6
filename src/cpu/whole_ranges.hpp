#pragma once
// The kernels that stream whole buffers (update.cpp: the optimizer's update; norm.cpp: the
// sums of squares and dot products; reduce.cpp: the in-order sum of ranks' buffers) touch
// [p, p + count) of each buffer they are given, and besides only their small arguments
// (the scalars, the arrays of buffer pointers) and their own stack. An AddressSanitizer build
// compiles those three files without ASan's per-access checks and defines
// MNIST_MT_WHOLE_RANGES (src/cpu/meson.build); each call then checks its ranges once
// (reads, writes) with ASan's own range check, which reports as a bad access would. The
// verdict is that of per-access checks, at a fraction of the cost: per-element checks of
// the update and of the sums over 1.2 M parameters were a quarter of a sanitized training
// test's time. In other builds the functions are empty (under ThreadSanitizer a range
// access costs what per-element ones do, so those files stay instrumented there).
#include <cstddef>

#if defined(MNIST_MT_WHOLE_RANGES)
// ASan's range checks, as its instrumentation calls them (address and size: uptr in the
// runtime, the same registers as void* and long on LP64; GCC declares them so).
extern "C" void __asan_loadN(void*, long);
extern "C" void __asan_storeN(void*, long);
#endif

namespace mnist_mt::cpu::whole_ranges {

// The caller reads [p, p + count).
template <typename T>
inline void reads([[maybe_unused]] const T* p, [[maybe_unused]] std::size_t count) {
#if defined(MNIST_MT_WHOLE_RANGES)
  if (count != 0) __asan_loadN(const_cast<T*>(p), static_cast<long>(count * sizeof(T)));
#endif
}

// The caller writes [p, p + count), or reads and writes it.
template <typename T>
inline void writes([[maybe_unused]] T* p, [[maybe_unused]] std::size_t count) {
#if defined(MNIST_MT_WHOLE_RANGES)
  if (count != 0) __asan_storeN(p, static_cast<long>(count * sizeof(T)));
#endif
}

}  // namespace mnist_mt::cpu::whole_ranges
