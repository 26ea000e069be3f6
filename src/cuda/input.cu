// uint8 images to the network's input, on the device so only bytes cross PCIe.
#include "element_ops.hpp"
#include "launch.cuh"

namespace mnist_mt::cuda {

static __global__ void normalize_kernel(const std::uint8_t* __restrict__ images, float* __restrict__ out,
                                        std::size_t count, float mean, float std) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    out[i] = normalize_at(images, i, mean, std);
}

void normalize_images(const std::uint8_t* images, float* out, std::size_t count, float mean, float std,
                      StreamHandle stream) {
  if (count == 0) return;
  normalize_kernel<<<grid_for(count), kBlock, 0, stream>>>(images, out, count, mean, std);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
