#pragma once
// fc layers through cuBLAS sgemm. Our buffers are row-major and cuBLAS is column-major,
// so each product is computed transposed: a row-major [r][c] matrix is the
// column-major [c][r] one with leading dimension c.
#include <cublas_v2.h>

#include <cstdint>

#include "owners.hpp"

namespace mnist_mt::cuda {

// A cuBLAS handle on `stream` with `workspace` as its own (so no product allocates), in
// FP32 math, or TF32 tensor-op math with `tf32`.
CublasOwner make_cublas(cudaStream_t stream, const DeviceBuffer<std::uint8_t>& workspace, bool tf32);

// y[rows][out] = x[rows][in] * w[out][in]^T (PyTorch's Linear, bias apart).
void linear_forward(cublasHandle_t handle, const float* x, const float* w, float* y, int rows, int in, int out);
// dw[out][in] = dy[rows][out]^T * x[rows][in].
void linear_backward_weight(cublasHandle_t handle, const float* x, const float* dy, float* dw, int rows, int in,
                            int out);
// dx[rows][in] = dy[rows][out] * w[out][in].
void linear_backward_data(cublasHandle_t handle, const float* w, const float* dy, float* dx, int rows, int in,
                          int out);

}  // namespace mnist_mt::cuda
