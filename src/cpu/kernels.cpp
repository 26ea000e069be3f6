#include "kernels.hpp"

// Each own kernel with vector variants has them compiled once per instruction set beside
// its op (activation.cpp, update.cpp, norm.cpp; fc1_backward.cpp picks its own); the free
// functions here call the variants for kernel_isa(), picked on first use.

namespace mnist_mt::cpu {

ElementKernels element_kernels(Isa isa) {
  return {dropout_forward_variant(isa), relu_dropout_backward_variant(isa), optimizer_update_variant(isa),
          sum_of_squares_variant(isa)};
}

namespace {
const ElementKernels& process_kernels() {
  static const ElementKernels kernels = element_kernels(kernel_isa());
  return kernels;
}
}  // namespace

void dropout_forward(const DropoutKey& key, const std::uint32_t* samples, std::uint32_t batch, RandomStream stream,
                     std::uint32_t elements, float p, float* x) {
  process_kernels().dropout_forward(key, samples, batch, stream, elements, p, x);
}

void relu_dropout_backward(const float* out, float scale, std::size_t count, float* d) {
  process_kernels().relu_dropout_backward(out, scale, count, d);
}

void optimizer_update(float* params, const float* grads, float* first, float* second, std::size_t count,
                      const UpdateScalars& scalars) {
  process_kernels().optimizer_update(params, grads, first, second, count, scalars);
}

double sum_of_squares(const float* x, std::size_t count) {
  double sum = 0;
  process_kernels().sum_of_squares(x, count, &sum);
  return sum;
}

}  // namespace mnist_mt::cpu
