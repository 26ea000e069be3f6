#include "plan_cache.hpp"

#include <utility>

#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {

// `make()` on the compute thread, waited for; its errors named with the device and `what`.
template <typename Make>
Plan& PlanCache::built(const std::string& what, Make make) {
  Plan* plan = nullptr;
  Stream& compute = device_.compute();
  compute.wait(compute.enqueue([&] {
    try {
      plan = &make();
    } catch (const dnnl::error& e) {
      throw RuntimeFailure(device_.name() + ": oneDNN, " + what + ": " + e.what());
    } catch (const RuntimeFailure& e) {  // names the operation (step.hpp's planned)
      throw RuntimeFailure(device_.name() + ": " + what + ": " + e.what());
    }
  }));
  return *plan;
}

Plan& PlanCache::batch(std::uint32_t n) {
  if (const auto it = plans_.find(n); it != plans_.end()) return *it->second;
  Plan& plan = built("plan for batch " + std::to_string(n), [&]() -> Plan& {
    auto made = build_plan(engine_, n, isa_, buffers_, params_, grads_);
    return *plans_.emplace(n, std::move(made)).first->second;
  });
  warn_if_reference(plan, device_.name());
  return plan;
}

void PlanCache::exchange_factors(int world) {
  if (world < 1) throw RuntimeFailure(device_.name() + ": exchange_factors among " + std::to_string(world) + " ranks");
  if (factors_) {
    Stream& compute = device_.compute();
    compute.wait(compute.enqueue([this] { factors_->clear(); }));
  }
  factors_.emplace(world, static_cast<std::uint32_t>(buffers_.max_batch));
}

Plan& PlanCache::factor_product(std::uint32_t rows) {
  if (!factors_ || rows == 0 || rows > factors_->capacity())
    throw RuntimeFailure(device_.name() + ": fc1's gradients from " + std::to_string(rows) +
                         " rows of factors, the replica gathers " +
                         std::to_string(factors_ ? factors_->capacity() : 0) + " rows");
  if (Plan* plan = factors_->find(rows)) return *plan;
  return built("fc1's product of " + std::to_string(rows) + " rows",
               [&]() -> Plan& { return factors_->add(engine_, rows, grads_); });
}

void PlanCache::clear() {
  plans_.clear();
  if (factors_) factors_->clear();
}

}  // namespace mnist_mt::cpu
