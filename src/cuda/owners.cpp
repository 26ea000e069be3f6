#include "owners.hpp"

#include <atomic>

#include "errors.hpp"

namespace mnist_mt::cuda {
namespace {
std::atomic<bool> keep_memory{false};
}  // namespace

void keep_memory_from_now() noexcept { keep_memory.store(true, std::memory_order_release); }
bool memory_kept() noexcept { return keep_memory.load(std::memory_order_acquire); }

StreamOwner make_stream(int priority) {
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
  return StreamOwner(stream);
}

EventOwner make_event() {
  cudaEvent_t event = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return EventOwner(event);
}

EventOwner make_timing_event() {
  cudaEvent_t event = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDefault));
  return EventOwner(event);
}

CudnnOwner make_cudnn(cudaStream_t stream) {
  cudnnHandle_t handle = nullptr;
  CUDNN_CHECK(cudnnCreate(&handle));
  CudnnOwner owner(handle);
  CUDNN_CHECK(cudnnSetStream(handle, stream));
  return owner;
}

TensorDescOwner make_tensor_desc(int n, int c, int h, int w) {
  cudnnTensorDescriptor_t desc = nullptr;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc));
  TensorDescOwner owner(desc);
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
  return owner;
}

FilterDescOwner make_filter_desc(int k, int c, int h, int w) {
  cudnnFilterDescriptor_t desc = nullptr;
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc));
  FilterDescOwner owner(desc);
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(desc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k, c, h, w));
  return owner;
}

ConvDescOwner make_conv_desc(cudnnMathType_t math) {
  cudnnConvolutionDescriptor_t desc = nullptr;
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc));
  ConvDescOwner owner(desc);
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(desc, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionMathType(desc, math));
  return owner;
}

void* DeviceMemory::allocate(std::size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void* PinnedMemory::allocate(std::size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

}  // namespace mnist_mt::cuda
