#pragma once
// Checked calls into CUDA, cuDNN, cuBLAS and NCCL (docs/architecture.md decision 16). One generator
// behind all four: a failed call throws RuntimeFailure naming the library's message, the
// expression, the function, file and line, and the current device.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

namespace mnist_mt::cuda {

[[noreturn]] void raise_failure(const char* library, const char* message, const char* expression,
                                const char* function, const char* file, int line);

}  // namespace mnist_mt::cuda

#define MNIST_MT_CHECK_GEN(expr, success, describe, library)                                       \
  do {                                                                                            \
    const auto mnist_mt_status_ = (expr);                                                         \
    if (mnist_mt_status_ != (success))                                                            \
      ::mnist_mt::cuda::raise_failure(library, describe(mnist_mt_status_), #expr, __func__, __FILE__, \
                                      __LINE__);                                                  \
  } while (0)

#define CUDA_CHECK(expr) MNIST_MT_CHECK_GEN(expr, cudaSuccess, cudaGetErrorString, "CUDA")
#define CUDNN_CHECK(expr) MNIST_MT_CHECK_GEN(expr, CUDNN_STATUS_SUCCESS, cudnnGetErrorString, "cuDNN")
#define CUBLAS_CHECK(expr) MNIST_MT_CHECK_GEN(expr, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, "cuBLAS")
#define NCCL_CHECK(expr) MNIST_MT_CHECK_GEN(expr, ncclSuccess, ncclGetErrorString, "NCCL")
