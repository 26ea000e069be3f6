#include "fc.hpp"

#include "errors.hpp"

namespace mnist_mt::cuda {
namespace {
constexpr float kOne = 1.0f, kZero = 0.0f;
}

void linear_forward(cublasHandle_t handle, const float* x, const float* w, float* y, int rows, int in, int out) {
  // y^T[out][rows] = (w^T[in][out])^T * x^T[in][rows]
  CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &kOne, w, in, x, in, &kZero, y, out));
}

void linear_backward_weight(cublasHandle_t handle, const float* x, const float* dy, float* dw, int rows, int in,
                            int out) {
  // dw^T[in][out] = x^T[in][rows] * (dy^T[out][rows])^T
  CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, &kOne, x, in, dy, out, &kZero, dw, in));
}

void linear_backward_data(cublasHandle_t handle, const float* w, const float* dy, float* dx, int rows, int in,
                          int out) {
  // dx^T[in][rows] = w^T[in][out] * dy^T[out][rows]
  CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, &kOne, w, in, dy, out, &kZero, dx, in));
}

CublasOwner make_cublas(cudaStream_t stream, const DeviceBuffer<std::uint8_t>& workspace, bool tf32) {
  cublasHandle_t handle = nullptr;
  CUBLAS_CHECK(cublasCreate(&handle));
  CublasOwner owner(handle);
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  // After the stream, which resets the workspace to cuBLAS's own: ours is allocated now,
  // so no gemm allocates later.
  CUBLAS_CHECK(cublasSetWorkspace(handle, workspace.data(), workspace.bytes()));
  CUBLAS_CHECK(cublasSetMathMode(handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return owner;
}

}  // namespace mnist_mt::cuda
