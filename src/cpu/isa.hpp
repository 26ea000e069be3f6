#pragma once
// The instruction set the CPU backend's own kernels run with, chosen once per process:
// oneDNN's effective ISA, so that ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) holds our
// kernels to the same level as oneDNN's and one machine can measure another's speed.
#include <cstddef>
#include <string>

namespace mnist_mt::cpu {

enum class Isa { kPortable, kAvx2, kAvx512 };

Isa kernel_isa();
const char* isa_name(Isa isa);  // "portable", "avx2", "avx512"

// Whether oneDNN's effective ISA has bf16 products (AVX512_BF16, or AMX), which
// Precision::kBf16 needs; no_bf16_products() says why not, in words for a user ("this CPU
// has neither AVX512_BF16 nor AMX", or what holds oneDNN below them).
bool bf16_products();
std::string no_bf16_products();

// The variant of a kernel (or a table of them) compiled for `isa` (simd.hpp).
template <class T>
T pick(Isa isa, T avx512, T avx2, T portable) {
  switch (isa) {
    case Isa::kAvx512: return avx512;
    case Isa::kAvx2: return avx2;
    case Isa::kPortable: break;
  }
  return portable;
}

// Channels per block of the activations from conv1 to the pooling (oneDNN's nChw16c on
// AVX-512, nChw8c otherwise): one vector register of floats.
constexpr std::size_t channel_block(Isa isa) { return isa == Isa::kAvx512 ? 16 : 8; }

}  // namespace mnist_mt::cpu
