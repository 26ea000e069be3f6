#pragma once
// The CPU backend's own kernels: the small operations oneDNN has no primitive for, each
// defined in its op's file (input.cpp, activation.cpp, loss.cpp, update.cpp, norm.cpp,
// fc1_forward.cpp, fc1_backward.cpp, reduce.cpp; conv1, pool and conv2's passes have headers
// of their own).
// All run on the calling thread (a device's compute stream) and allocate nothing.
#include <cstddef>
#include <cstdint>
#include <span>

#include "isa.hpp"
#include "mnist_mt/device.hpp"
#include "mnist_mt/optimizer.hpp"
#include "mnist_mt/philox.hpp"
#include "mnist_mt/replica.hpp"

namespace mnist_mt::cpu {

// (x/255 - mean)/std in fp32, the operations of torchvision's ToTensor and Normalize.
void normalise_images(const std::uint8_t* pixels, std::size_t count, float* out);

// Dropout in place on `batch` rows of `elements`: element e of row n is scaled by 1/(1-p)
// when dropout_keep(key.seed, key.epoch, samples[n], stream, e, p), else zeroed (PyTorch's
// train-mode Dropout with docs/architecture.md decision 9's masks). e is PyTorch's flatten order.
void dropout_forward(const DropoutKey& key, const std::uint32_t* samples, std::uint32_t batch, RandomStream stream,
                     std::uint32_t elements, float p, float* x);

// The backward of a ReLU followed by dropout scaled by `scale` (1 when dropout is off), in
// place, from the dropout's output: d = out > 0 ? d * scale : 0. A kept value is the ReLU
// output times scale > 0, so out > 0 exactly where both let the gradient through.
void relu_dropout_backward(const float* out, float scale, std::size_t count, float* d);

struct LossSums {
  double loss = 0;     // sum of per-sample NLL
  double correct = 0;  // samples whose argmax is the label
};
// Per row of 10 logits: log_softmax into logp, NLL of the label and argmax into sums, and
// d(sum NLL)/d(logits)/denominator = (softmax - onehot)/denominator into dlogits.
void log_softmax_nll(const float* logits, const std::uint8_t* labels, std::uint32_t batch, float denominator,
                     float* logp, float* dlogits, LossSums& sums);

// One optimizer update of `count` parameters (optimizer.hpp: sgd_at, adam_at, adadelta_at):
// `first` and `second` are its state buffers (SGD reads `first` only, and only with
// momentum). The vector variants fuse products and sums (GCC's default contraction).
void optimizer_update(float* params, const float* grads, float* first, float* second, std::size_t count,
                      const UpdateScalars& scalars);

// The sum of x[i]^2 in double, added in the same order on every ISA (the gradients'
// norm, which every rank must compute to the same bits).
double sum_of_squares(const float* x, std::size_t count);

// --exchange factors (fc1_backward.cpp): rows [first, first + count) of fc1's weight
// gradient G^T X from `rows` rows of G (kHidden floats a row) and X (kFlat a row), into
// `out` (count x kFlat): each element the sum over the rows in their order, with fused
// multiply-adds on AVX2 and AVX-512 (so the bits depend on the ISA, not on the chunking).
// `first` and `count` multiples of 8.
void factor_product_rows(const float* g, const float* x, std::uint32_t rows, std::size_t first, std::size_t count,
                         float* out);
// The squared norm of that whole product from the factors: the sum over row pairs (a, b)
// of (g_a . g_b)(x_a . x_b), in double, its dot products on `isa`'s vectors: the same bits
// on every ISA.
double factor_product_squares(const float* g, const float* x, std::uint32_t rows, Isa isa = kernel_isa());
// fc1's bias gradient: the column sums of `rows` rows of G (kHidden floats a row), added
// in row order.
void fc1_bias_gradient(const float* g, std::uint32_t rows, float* bias);
// fc1's backward (weights) of one replica's batch, where own_fc1_backward() (fc.hpp): the
// weight gradient G^T X by factor_product_rows over all 128 rows, the bias gradient by
// fc1_bias_gradient.
void fc1_backward_weights(const float* g, const float* x, std::uint32_t rows, float* weights, float* bias,
                          Isa isa = kernel_isa());
// fc1's backward (data) of one replica's batch, where own_fc1_backward() (fc.hpp): out = G W
// (rows x kFlat), each element the sum over fc1's 128 outputs in their order (fused
// multiply-adds on AVX2 and AVX-512: the same bits on both), through
// `g_t`, a scratch of kHidden x fc1_transposed_stride(rows) floats for G^T.
std::size_t fc1_transposed_stride(std::uint32_t rows);
void fc1_backward_data(const float* g, const float* w, std::uint32_t rows, float* g_t, float* out,
                       Isa isa = kernel_isa());
// fc1's forward of one replica's batch, where own_fc1_forward() (fc.hpp; fc1_forward.cpp):
// out[n] (kHidden floats a row) = ReLU(bias + W x[n]) for `rows` rows of x (kFlat floats
// apart), W fc1's weights (kHidden x kFlat). Each output the same bits whatever the batch.
void fc1_forward(const float* x, const float* w, const float* bias, std::uint32_t rows, float* out,
                 Isa isa = kernel_isa());
using FactorRowsFn = void (*)(const float*, const float*, std::uint32_t, std::size_t, std::size_t, float*);
FactorRowsFn factor_product_rows_variant(Isa isa);  // fc1_backward.cpp

// out[j][i] = (((in[0][i] + in[1][i]) + in[2][i]) + ...) for i in [begin, begin + count)
// and every j, an average divided by `divisor` (times its inverse when a power of two:
// the same correctly rounded value). The order of additions never depends on the range,
// hence bitwise reproducible collectives (Device::reduce); an output may be an input.
// Returns the sum of squares of the result's range, as sum_of_squares adds it per block.
double reduce_in_order(std::span<const float* const> in, std::size_t begin, std::size_t count,
                       std::span<float* const> out, ReduceOp op, std::size_t divisor);

// The variants of dropout_forward, relu_dropout_backward, optimizer_update and sum_of_squares
// for one ISA, each defined beside its op; the functions above run those of kernel_isa().
using DropoutForwardFn = void (*)(const DropoutKey&, const std::uint32_t*, std::uint32_t, RandomStream, std::uint32_t,
                                  float, float*);
using ReluDropoutBackwardFn = void (*)(const float*, float, std::size_t, float*);
using OptimizerUpdateFn = void (*)(float*, const float*, float*, float*, std::size_t, const UpdateScalars&);
using SumOfSquaresFn = void (*)(const float*, std::size_t, double*);
DropoutForwardFn dropout_forward_variant(Isa isa);          // activation.cpp
ReluDropoutBackwardFn relu_dropout_backward_variant(Isa isa);  // activation.cpp
OptimizerUpdateFn optimizer_update_variant(Isa isa);        // update.cpp
SumOfSquaresFn sum_of_squares_variant(Isa isa);             // norm.cpp
// a . b in double, added in sum_of_squares' order (sum_of_squares is x . x).
using DotFn = void (*)(const float*, const float*, std::size_t, double*);
DotFn dot_in_order_variant(Isa isa);                         // norm.cpp
struct ElementKernels {
  DropoutForwardFn dropout_forward;
  ReluDropoutBackwardFn relu_dropout_backward;
  OptimizerUpdateFn optimizer_update;
  SumOfSquaresFn sum_of_squares;
};
ElementKernels element_kernels(Isa isa);

}  // namespace mnist_mt::cpu
