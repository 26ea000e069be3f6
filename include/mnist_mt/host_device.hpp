#pragma once
// Functions both nvcc and the host compiler build (MNIST_MT_HD), so that the CPU and CUDA
// backends, and the tests' references, share one formula for a value.
#if defined(__CUDACC__)
#define MNIST_MT_HD __host__ __device__ __forceinline__
#else
#define MNIST_MT_HD inline
#endif

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace mnist_mt {

// fp32 arithmetic rounded to nearest and never fused: the __f*_rn intrinsics keep nvcc
// from contracting a product and a sum into an FMA. On the host, code that needs the
// separate roundings builds with -ffp-contract=off (GCC contracts by default in C++);
// the CPU backend's vector variants are built with contraction and fuse.
MNIST_MT_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MNIST_MT_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MNIST_MT_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
MNIST_MT_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace mnist_mt
