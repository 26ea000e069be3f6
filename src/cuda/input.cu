// uint8 images to the network's input, on the device so only bytes cross PCIe: copied
// with the batch, or gathered by sample index from a split held in device memory.
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

static __global__ void gather_kernel(const std::uint8_t* __restrict__ split_images,
                                     const std::uint8_t* __restrict__ split_labels,
                                     const std::uint32_t* __restrict__ samples, std::uint32_t rows,
                                     float* __restrict__ out, std::uint8_t* __restrict__ labels_out, float mean,
                                     float std) {
  const std::uint32_t count = rows * static_cast<std::uint32_t>(kImageBytes);
  const auto first = static_cast<std::uint32_t>(global_thread());
  const auto stride = static_cast<std::uint32_t>(grid_threads());
  for (std::uint32_t i = first; i < count; i += stride)
    out[i] = gather_normalize_at(split_images, samples, i, mean, std);
  for (std::uint32_t r = first; r < rows; r += stride) labels_out[r] = split_labels[samples[r]];
}

void gather_images(const std::uint8_t* split_images, const std::uint8_t* split_labels, const std::uint32_t* samples,
                   std::uint32_t rows, float* out, std::uint8_t* labels_out, float mean, float std,
                   StreamHandle stream) {
  if (rows == 0) return;
  const std::size_t count = std::size_t{rows} * kImageBytes;
  gather_kernel<<<grid_for(count), kBlock, 0, stream>>>(split_images, split_labels, samples, rows, out, labels_out,
                                                        mean, std);
  CHECK_LAUNCH();
}

static __global__ void gather_planned_kernel(const std::uint32_t* __restrict__ plan, std::uint32_t rows,
                                             const std::uint8_t* __restrict__ split_images,
                                             const std::uint8_t* __restrict__ split_labels, float* __restrict__ out,
                                             std::uint32_t* __restrict__ samples_out,
                                             std::uint8_t* __restrict__ labels_out, float mean, float std) {
  const std::uint32_t* samples = plan + kPlanHeader + std::size_t{plan[kPlanStep]} * rows;
  const std::uint32_t count = rows * static_cast<std::uint32_t>(kImageBytes);
  const auto first = static_cast<std::uint32_t>(global_thread());
  const auto stride = static_cast<std::uint32_t>(grid_threads());
  for (std::uint32_t i = first; i < count; i += stride)
    out[i] = gather_normalize_at(split_images, samples, i, mean, std);
  for (std::uint32_t r = first; r < rows; r += stride) {
    samples_out[r] = samples[r];
    labels_out[r] = split_labels[samples[r]];
  }
}

// After the gather, on the same stream: no block of it reads the step any more.
static __global__ void advance_plan_kernel(std::uint32_t* plan) { ++plan[kPlanStep]; }

void gather_planned(std::uint32_t* plan, std::uint32_t rows, const std::uint8_t* split_images,
                    const std::uint8_t* split_labels, float* out, std::uint32_t* samples_out,
                    std::uint8_t* labels_out, float mean, float std, StreamHandle stream) {
  if (rows == 0) return;
  const std::size_t count = std::size_t{rows} * kImageBytes;
  gather_planned_kernel<<<grid_for(count), kBlock, 0, stream>>>(plan, rows, split_images, split_labels, out,
                                                                samples_out, labels_out, mean, std);
  CHECK_LAUNCH();
  advance_plan_kernel<<<1, 1, 0, stream>>>(plan);
  CHECK_LAUNCH();
}

}  // namespace mnist_mt::cuda
