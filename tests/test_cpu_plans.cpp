// No operation of the CPU replica's step ever runs a reference (unoptimised)
// implementation, at any batch size the trainer uses, and the own kernels run with the
// process's ISA. tests/meson.build runs this at the native ISA and at ONEDNN_MAX_CPU_ISA=AVX2.
#include <gtest/gtest.h>

#include <cctype>
#include <dnnl.hpp>
#include <cstdlib>
#include <iostream>
#include <string>

#include "cpu/device.hpp"
#include "cpu/isa.hpp"
#include "cpu/replica.hpp"
#include "cpu/step.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {
namespace {

TEST(CpuPlans, NoOperationRunsAReferenceImplementation) {
  CpuDevice device(0);
  auto replica = make_cpu_replica(device, 256);
  const std::string own = std::string("own:") + isa_name(kernel_isa());
  RecordProperty("kernel_isa", isa_name(kernel_isa()));
  std::cout << "kernel isa: " << isa_name(kernel_isa()) << "\n";
  for (std::uint32_t batch : {1u, 3u, 4u, 64u, 256u}) {
    const std::vector<KernelInfo> ops = replica->kernels(batch);
    ASSERT_FALSE(ops.empty()) << "batch " << batch;
    std::size_t owned = 0;
    for (const KernelInfo& k : ops) {
      if (batch == 1 || batch == 256) std::cout << "batch " << batch << "  " << k.op << ": " << k.impl << "\n";
      if (k.impl.empty() || is_reference(k.impl))
        ADD_FAILURE() << k.op << " at batch " << batch << " runs \"" << k.impl << "\"";
      if (k.impl.starts_with("own:")) {
        ++owned;
        EXPECT_TRUE(k.impl == own || k.impl.starts_with(own + " ")) << k.op << " at batch " << batch << ": " << k.impl;
      }
    }
    EXPECT_GT(owned, 0u) << "batch " << batch;
  }
}

// The names oneDNN gives its reference implementations, and not its optimised ones.
TEST(CpuPlans, ReferenceImplementationsAreRecognised) {
  for (const char* impl : {"ref:any", "gemm:ref", "x64:gemm:ref", "ref_int8:any", "jit:avx2 + ref:any"})
    EXPECT_TRUE(is_reference(impl)) << impl;
  for (const char* impl : {"jit:avx2", "x64:gemm:jit", "jit_wino_4x3:avx512_core", "own:avx2", "reorder jit:uni",
                           "brg:prefer_ymm"})
    EXPECT_FALSE(is_reference(impl)) << impl;
}

// The AVX2 registration really runs the AVX2 kernels (where the CPU has them).
TEST(CpuPlans, KernelIsaFollowsOneDnnLimit) {
  const char* limit = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (limit == nullptr) limit = std::getenv("DNNL_MAX_CPU_ISA");
  std::string name = limit == nullptr ? "" : limit;
  for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (name != "AVX2") GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA is not AVX2";
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) GTEST_SKIP() << "this CPU lacks AVX2";
  EXPECT_STREQ(isa_name(kernel_isa()), "avx2");
}

// oneDNN's own message says what failed, not which of the step's operations: the error
// a plan throws names it.
TEST(CpuPlans, AOneDnnFailureWhilePlanningNamesTheOperation) {
  using dnnl::memory;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const memory::desc src({4, 9216}, memory::data_type::f32, memory::format_tag::nc);
  const memory::desc weights({128, 100}, memory::data_type::f32, memory::format_tag::oi);  // 100 != 9216
  const memory::desc dst({4, 128}, memory::data_type::f32, memory::format_tag::nc);
  try {
    planned(kFc1Forward, [&] {
      return dnnl::inner_product_forward::primitive_desc(
          dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, src, weights, dst), engine);
    });
    ADD_FAILURE() << "oneDNN accepted mismatched shapes";
  } catch (const RuntimeFailure& e) {
    EXPECT_EQ(std::string(e.what()).rfind(std::string("oneDNN: ") + kOpNames[kFc1Forward] + ": ", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace mnist_mt::cpu
