#pragma once
// Move-only owners of CUDA, cuDNN and cuBLAS handles and of device and pinned memory.
// All of them are taken at setup (docs/architecture.md decision 5). Destructors never throw; the
// owner of device objects makes their device current before they are released.
#include <cstddef>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

namespace mnist_mt::cuda {

template <typename T, typename Release>
class Owner {
 public:
  Owner() = default;
  explicit Owner(T handle) : handle_(handle) {}
  ~Owner() { reset(); }
  Owner(Owner&& other) noexcept : handle_(std::exchange(other.handle_, T{})) {}
  Owner& operator=(Owner&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, T{});
    }
    return *this;
  }
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;

  T get() const { return handle_; }

 private:
  void reset() noexcept {
    if (handle_ != T{}) Release{}(handle_);
    handle_ = T{};
  }
  T handle_{};
};

struct StreamRelease {
  void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); }
};
struct EventRelease {
  void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
};
struct CudnnRelease {
  void operator()(cudnnHandle_t h) const noexcept { cudnnDestroy(h); }
};
struct CublasRelease {
  void operator()(cublasHandle_t h) const noexcept { cublasDestroy(h); }
};
struct TensorDescRelease {
  void operator()(cudnnTensorDescriptor_t d) const noexcept { cudnnDestroyTensorDescriptor(d); }
};
struct FilterDescRelease {
  void operator()(cudnnFilterDescriptor_t d) const noexcept { cudnnDestroyFilterDescriptor(d); }
};
struct ConvDescRelease {
  void operator()(cudnnConvolutionDescriptor_t d) const noexcept { cudnnDestroyConvolutionDescriptor(d); }
};

using StreamOwner = Owner<cudaStream_t, StreamRelease>;
using EventOwner = Owner<cudaEvent_t, EventRelease>;
using CudnnOwner = Owner<cudnnHandle_t, CudnnRelease>;
using CublasOwner = Owner<cublasHandle_t, CublasRelease>;
using TensorDescOwner = Owner<cudnnTensorDescriptor_t, TensorDescRelease>;
using FilterDescOwner = Owner<cudnnFilterDescriptor_t, FilterDescRelease>;
using ConvDescOwner = Owner<cudnnConvolutionDescriptor_t, ConvDescRelease>;

// On the current device. A non-blocking stream never waits for the legacy default stream.
StreamOwner make_stream(int priority);
// Timing off: ordering events are cheaper to record and wait for.
EventOwner make_event();
// Timing on: for Device::mark().
EventOwner make_timing_event();
CudnnOwner make_cudnn(cudaStream_t stream);
// fp32 NCHW.
TensorDescOwner make_tensor_desc(int n, int c, int h, int w);
FilterDescOwner make_filter_desc(int k, int c, int h, int w);
// Unpadded, stride 1 cross-correlation (PyTorch's Conv2d) in fp32.
ConvDescOwner make_conv_desc(cudnnMathType_t math);

// Any thread, once a device's work has outlived an abort (CudaDevice::wedged()): from
// then on device and pinned memory is left allocated, not freed. That work may still use
// it, and cudaFree would wait for the work, which may never end.
void keep_memory_from_now() noexcept;
bool memory_kept() noexcept;

struct DeviceMemory {
  static void* allocate(std::size_t bytes);
  void operator()(void* p) const noexcept {
    if (!memory_kept()) cudaFree(p);
  }
};
struct PinnedMemory {
  static void* allocate(std::size_t bytes);
  void operator()(void* p) const noexcept {
    if (!memory_kept()) cudaFreeHost(p);
  }
};

// `count` elements of T, uninitialised.
template <typename T, typename Kind>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t count) : memory_(Kind::allocate(count * sizeof(T))), count_(count) {}

  T* data() const { return static_cast<T*>(memory_.get()); }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

 private:
  Owner<void*, Kind> memory_;
  std::size_t count_ = 0;
};

template <typename T>
using DeviceBuffer = Buffer<T, DeviceMemory>;
template <typename T>
using PinnedBuffer = Buffer<T, PinnedMemory>;

}  // namespace mnist_mt::cuda
