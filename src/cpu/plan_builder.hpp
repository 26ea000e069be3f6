#pragma once
// Builds a Plan's oneDNN steps: memory bound to the replica's buffers, primitives
// recorded with the implementation oneDNN picked, reorders where a layout differs.
// Used by the files of the layers that run through oneDNN (conv2_forward.cpp, fc.cpp).
#include <dnnl.hpp>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "aligned.hpp"
#include "mnist_mt/error.hpp"
#include "plan.hpp"
#include "step.hpp"

namespace mnist_mt::cpu {

using dnnl::memory;
using Tag = memory::format_tag;
using Dim = memory::dim;
constexpr auto kF32 = memory::data_type::f32;

// A parameter's state-dict layout (oihw, oi or x).
inline memory::desc plain(const ParamInfo& p) {
  memory::dims dims(p.shape.begin(), p.shape.begin() + p.dims);
  return {dims, kF32, p.dims == 4 ? Tag::oihw : p.dims == 2 ? Tag::oi : Tag::x};
}

class PlanBuilder {
 public:
  PlanBuilder(const dnnl::engine& engine, Plan& plan) : engine_(engine), plan_(plan) {
    dnnl::post_ops relu;
    relu.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    relu_attr_.set_post_ops(relu);
  }
  const dnnl::engine& engine() const { return engine_; }
  const dnnl::primitive_attr& relu_attr() const { return relu_attr_; }

  // Memory over a buffer of the replica, which must hold the descriptor's bytes.
  memory bind(const memory::desc& desc, void* data, std::size_t capacity_bytes) {
    if (desc.get_size() > capacity_bytes)
      throw RuntimeFailure("oneDNN layout for batch " + std::to_string(plan_.batch) + " needs " +
                           std::to_string(desc.get_size()) + " bytes, its buffer holds " +
                           std::to_string(capacity_bytes));
    return plan_.memories.emplace_back(desc, engine_, data);
  }
  template <class T>
  memory bind(const memory::desc& desc, const Aligned<T>& buffer, std::size_t capacity_count) {
    return bind(desc, buffer.get(), capacity_count * sizeof(T));
  }
  // A parameter (or its gradient) in its state-dict layout, inside the flat buffer at `base`.
  memory view(const ParamInfo& p, float* base) { return bind(plain(p), base + p.offset, p.count * sizeof(float)); }

  // A primitive bound to its arguments, recorded as (part of) operation `op`.
  template <class Pd>
  Step step(Op op, const Pd& pd, std::initializer_list<std::pair<int, memory>> args, const char* what = "") {
    std::string& impl = plan_.impl[op];
    impl += (impl.empty() ? "" : " + ") + std::string(what) + pd.impl_info_str();
    Step s{planned(op, [&] { return dnnl::primitive(pd.get()); }), {}, op};
    for (const auto& [arg, mem] : args) s.args.push_back({arg, mem.get()});
    return s;
  }

  // `user` itself when `wanted` is its layout; otherwise a buffer of the plan in the
  // wanted layout, filled by a reorder from `user` that is added to `steps`.
  memory reordered(Op op, const memory& user, const memory::desc& wanted, std::vector<Step>& steps) {
    if (wanted == user.get_desc()) return user;
    auto& owned = plan_.owned.emplace_back(aligned_zeros<float>(wanted.get_size() / sizeof(float)));
    const memory buffer = plan_.memories.emplace_back(wanted, engine_, owned.get());
    const auto pd = planned(op, [&] { return dnnl::reorder::primitive_desc(engine_, user.get_desc(), engine_, wanted); });
    steps.push_back(step(op, pd, {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, buffer}}, "reorder "));
    return buffer;
  }

 private:
  const dnnl::engine& engine_;
  Plan& plan_;
  dnnl::primitive_attr relu_attr_;
};

}  // namespace mnist_mt::cpu
