#include "isa.hpp"

#include <cstdlib>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
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

// Whether the CPU has AVX512_BF16 (CPUID leaf 7 subleaf 1, EAX bit 5) or AMX-BF16 (leaf 7,
// EDX bit 22), whatever oneDNN may use.
bool cpu_has_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool avx512_bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && (a & (1u << 5)) != 0;
  const bool amx_bf16 = __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (d & (1u << 22)) != 0;
  return avx512_bf16 || amx_bf16;
#else
  return false;
#endif
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
  if (!cpu_has_bf16()) return "this CPU has neither AVX512_BF16 nor AMX";
  std::string why = std::string("oneDNN does not use this CPU's AVX512_BF16 or AMX (it runs at ") +
                    isa_name(kernel_isa());
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"})
    if (const char* held = std::getenv(name)) return why + "; " + name + "=" + held + ")";
  return why + ")";
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
