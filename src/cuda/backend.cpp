// The CUDA backend: a device per GPU, NCCL communicators, the cuDNN/cuBLAS replica.
#include "mnist_mt/backend.hpp"

#include "communicator.hpp"
#include "device.hpp"
#include "errors.hpp"
#include "mnist_mt/error.hpp"
#include "replica.hpp"

namespace mnist_mt {
namespace {

cuda::CudaDevice& cuda_device(Device& device) {
  auto* d = dynamic_cast<cuda::CudaDevice*>(&device);
  if (d == nullptr) throw RuntimeFailure(device.name() + " is not a CUDA device");
  return *d;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options) : options_(options) {}
  bool tf32() const override { return options_.tf32; }

  std::string name() const override { return "cuda"; }

  // No driver or no GPU counts as none.
  int device_count() const override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return count;
  }

  std::vector<std::unique_ptr<Device>> make_devices(std::span<const int> ids) override {
    std::vector<std::unique_ptr<Device>> devices;
    for (int id : ids) devices.push_back(std::make_unique<cuda::CudaDevice>(id));
    return devices;
  }

  std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<Device* const> devices,
                                                                const Place& place) override {
    std::vector<cuda::CudaDevice*> gpus;
    for (Device* d : devices) gpus.push_back(&cuda_device(*d));
    return cuda::make_communicators(gpus, options_.cuda_graphs, place);
  }

  std::unique_ptr<Replica> make_replica(Device& device, std::uint32_t max_batch) override {
    return cuda::make_cuda_replica(cuda_device(device), max_batch, options_);
  }

  void group_start() override { cuda::start_nccl_group(); }
  void group_end() override { cuda::end_nccl_group(); }

 private:
  BackendOptions options_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  if (options.precision != Precision::kFp32)
    throw InputError("bf16 runs on CPU devices only; CUDA devices train in fp32", "precision");
  return std::make_unique<CudaBackend>(options);
}

bool cuda_built() { return true; }

}  // namespace mnist_mt
