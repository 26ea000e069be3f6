#include "conv2_matmul.hpp"

#include <algorithm>
#include <tuple>

namespace mnist_mt::cpu {

std::uint32_t chunk_for(std::uint32_t batch, std::uint32_t max) {
  for (std::uint32_t c = std::min(batch, max); c > 1; --c)
    if (batch % c == 0) return c;
  return 1;
}

dnnl::matmul::primitive_desc make_batched_matmul(const dnnl::engine& engine, const dnnl::memory::desc& src,
                                                 const dnnl::memory::desc& weights, const dnnl::memory::desc& dst,
                                                 bool accumulate, Op op) {
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    attr.set_post_ops(sum);
  }
  return planned(op, [&] { return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, engine); });
}

Step bind_matmul(const dnnl::primitive_desc& pd, const dnnl::engine& engine, std::vector<dnnl::memory>& memories,
                 float* src, float* weights, float* dst, Op op) {
  Step step{planned(op, [&] { return dnnl::primitive(pd.get()); }), {}, op};
  for (const auto& [arg, desc, data] : {std::tuple{DNNL_ARG_SRC, pd.src_desc(), src},
                                        std::tuple{DNNL_ARG_WEIGHTS, pd.weights_desc(), weights},
                                        std::tuple{DNNL_ARG_DST, pd.dst_desc(), dst}})
    step.args.push_back({arg, memories.emplace_back(desc, engine, data).get()});
  return step;
}

}  // namespace mnist_mt::cpu
