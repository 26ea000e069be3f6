#pragma once
// conv2's backward pass (32 -> 64 channels, 3x3, on 26x26) by Winograd F(4x4, 3x3): the
// transforms of conv2_winograd.hpp and, between them, batched matrix products over the 36
// positions of a tile (oneDNN matmul), with a quarter of direct convolution's
// multiplications. oneDNN has Winograd kernels for AVX-512 only; ours measured faster
// than those too. One pass computes the weight, bias and input gradients, chunk by chunk
// of a few images so that the transformed tiles stay in cache. All memory is taken at
// construction.
//
// The forward pass is not this F(4x4, 3x3) (conv2_forward.hpp: oneDNN's Winograd where it
// takes it (AVX-512 from 9 images), our F(2x2, 3x3) elsewhere on AVX-512 and AVX2, oneDNN's
// direct convolution on SSE2, all of which agree with PyTorch's golden steps): in the forward,
// this Winograd's rounding moved a max-pooling tie in the golden three-step test and with
// it the gradients, while in the backward its rounding only perturbs the gradients by ~1e-6.
#include <cstdint>
#include <dnnl.hpp>
#include <memory>
#include <string>
#include <vector>

#include "aligned.hpp"
#include "conv2_winograd.hpp"
#include "isa.hpp"
#include "step.hpp"

namespace mnist_mt::cpu {

class Conv2WinogradBackward {
 public:
  // For batches of exactly `batch` images; primitives made on the calling thread.
  Conv2WinogradBackward(const dnnl::engine& engine, std::uint32_t batch, Isa isa);
  Conv2WinogradBackward(const Conv2WinogradBackward&) = delete;
  Conv2WinogradBackward& operator=(const Conv2WinogradBackward&) = delete;

  // "own:<isa> winograd 4x3 + matmul <oneDNN's implementations>"
  const std::string& impl() const { return impl_; }

  // From d_a2, the gradient of conv2's output (batch x 64/B x 24 x 24 x B), the forward's
  // input a1 (batch x 32/B x 26 x 26 x B) and weights w (state dict): the weight and bias
  // gradients dw, db (state-dict layouts) and the input gradient d_a1 (all written).
  void backward(const dnnl::stream& stream, const float* a1, const float* w, const float* d_a2, float* dw, float* db,
                float* d_a1);
  // The same from the gradient of the max pool's output, d_pool (batch x 64 x 12 x 12),
  // and the pool forward's argmax (pool.hpp), with the pool's backward (and its ReLU's)
  // fused into the output-gradient transform: no d_a2 map is written or read. The same
  // bits as pool.hpp's backward followed by backward().
  void backward_pooled(const dnnl::stream& stream, const float* a1, const float* w, const float* d_pool,
                       const std::uint8_t* argmax, float* dw, float* db, float* d_a1);

 private:
  // Both backward passes: `output_grad(n, bias)` transforms images n.. of one chunk into z_.
  template <class OutputGrad>
  void chunks(const dnnl::stream& stream, const float* a1, const float* w, const OutputGrad& output_grad, float* dw,
              float* db, float* d_a1);

  WinogradKernels kernels_;
  std::uint32_t batch_, chunk_;  // images per chunk: the largest divisor of batch_ up to a cap
  Aligned<float> u_, du_, v_, z_, dv_;  // transformed weights and their gradient; one chunk's tiles
  std::vector<dnnl::memory> memories_;
  Step backward_data_, backward_weights_;  // dV = Z U^T; dU += V^T Z
  std::string impl_;
};

}  // namespace mnist_mt::cpu
