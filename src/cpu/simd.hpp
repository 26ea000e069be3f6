#pragma once
// Vectors of B floats (GCC vector extensions) for the own kernels, and the attributes that
// compile one body per instruction set. A kernel is a template over B, always inlined
// into three entry points (MNIST_MT_ISA_VARIANTS): AVX-512 (B = 16), AVX2 (B = 8) and
// portable (SSE2: B = 8, which GCC lowers to pairs of registers); isa.hpp picks one of
// them once per process. Vectors wider than the baseline only pass between always-inlined functions,
// so GCC's -Wpsabi notes about their calling convention (off in meson.build) do not apply.
#include <cstddef>

namespace mnist_mt::cpu {

template <std::size_t B>
struct VecOf {
  typedef float type __attribute__((vector_size(4 * B)));
};
template <std::size_t B>
using Vec = typename VecOf<B>::type;

template <std::size_t B>
[[gnu::always_inline]] inline Vec<B> load(const float* p) {
  Vec<B> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <std::size_t B>
[[gnu::always_inline]] inline void store(float* p, const Vec<B>& v) {
  __builtin_memcpy(p, &v, sizeof v);
}

}  // namespace mnist_mt::cpu

#define MNIST_MT_AVX512 [[gnu::target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]]
#define MNIST_MT_AVX2 [[gnu::target("avx2,fma")]]

// The three entry points name_avx512, name_avx2 and name_portable of the always-inlined
// template body<B>, with B the ISA's channel_block (isa.hpp): 16, 8 and 8.
#define MNIST_MT_ISA_VARIANTS(name, body, params, args)       \
  MNIST_MT_AVX512 void name##_avx512 params { body<16> args; } \
  MNIST_MT_AVX2 void name##_avx2 params { body<8> args; }      \
  void name##_portable params { body<8> args; }
