#include "isa.hpp"

#include <cstdlib>
#include <dnnl.hpp>

namespace mnist_mt::cpu {
namespace {

Isa detect() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  // oneDNN's ISA values are bit sets that contain the ISAs below them.
  const bool avx512 = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  const bool avx2 = (isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2 && __builtin_cpu_supports("fma");
  if (avx512) return Isa::kAvx512;
  return avx2 ? Isa::kAvx2 : Isa::kPortable;
}

}  // namespace

Isa kernel_isa() {
  static const Isa isa = detect();
  return isa;
}

bool bf16_products() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

std::string no_bf16_products() {
  return std::string("this CPU has neither AVX512_BF16 nor AMX for bf16 products (oneDNN runs at ") +
         isa_name(kernel_isa()) + (std::getenv("ONEDNN_MAX_CPU_ISA") || std::getenv("DNNL_MAX_CPU_ISA")
                                       ? ", held there by ONEDNN_MAX_CPU_ISA)"
                                       : ")");
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kPortable: break;
  }
  return "portable";
}

}  // namespace mnist_mt::cpu
