#pragma once
// What conv2's Winograd passes (conv2_forward.hpp, conv2_backward.hpp) share: their chunks of
// images, and the oneDNN matmuls over a tile's positions between their transforms.
#include <cstdint>
#include <dnnl.hpp>
#include <vector>

#include "step.hpp"

namespace mnist_mt::cpu {

// Images per chunk: the largest divisor of `batch` up to `max`.
std::uint32_t chunk_for(std::uint32_t batch, std::uint32_t max);

// A matmul batched over the descriptors' first dimension, recorded as (part of) `op`;
// with `accumulate`, dst += src x weights.
dnnl::matmul::primitive_desc make_batched_matmul(const dnnl::engine& engine, const dnnl::memory::desc& src,
                                                 const dnnl::memory::desc& weights, const dnnl::memory::desc& dst,
                                                 bool accumulate, Op op);

// The matmul bound to its three buffers; the memory objects are kept in `memories`.
Step bind_matmul(const dnnl::primitive_desc& pd, const dnnl::engine& engine, std::vector<dnnl::memory>& memories,
                 float* src, float* weights, float* dst, Op op);

}  // namespace mnist_mt::cpu
