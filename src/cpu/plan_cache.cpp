#include "plan_cache.hpp"

#include <utility>

#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {

Plan& PlanCache::batch(std::uint32_t n) {
  if (const auto it = plans_.find(n); it != plans_.end()) return *it->second;
  Plan* plan = nullptr;
  Stream& compute = device_.compute();
  compute.wait(compute.enqueue([&] {
    try {
      plan = plans_.emplace(n, build_plan(engine_, n, isa_, buffers_, params_, grads_)).first->second.get();
    } catch (const dnnl::error& e) {
      throw RuntimeFailure(device_.name() + ": oneDNN, plan for batch " + std::to_string(n) + ": " + e.what());
    } catch (const RuntimeFailure& e) {  // names the operation (step.hpp's planned)
      throw RuntimeFailure(device_.name() + ": plan for batch " + std::to_string(n) + ": " + e.what());
    }
  }));
  warn_if_reference(*plan, device_.name());
  return *plan;
}

}  // namespace mnist_mt::cpu
