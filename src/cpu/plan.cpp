#include "plan.hpp"

#include <algorithm>
#include <iostream>
#include <mutex>
#include <string>

#include "conv2_forward.hpp"
#include "fc.hpp"
#include "mnist_mt/error.hpp"
#include "plan_builder.hpp"
#include "replica.hpp"

namespace mnist_mt::cpu {

std::unique_ptr<Plan> build_plan(const dnnl::engine& engine, std::uint32_t batch, Isa isa, const Buffers& buf,
                                 float* params, float* grads) {
  auto plan = std::make_unique<Plan>();
  plan->batch = batch;
  PlanBuilder b(engine, *plan);
  const std::string own = std::string("own:") + isa_name(isa);
  for (Op op : {kInputOp, kConv1Forward, kPoolForward, kDropout1Forward, kDropout2Forward, kLossOp, kDropout2Backward,
                kDropout1Backward, kConv1BackwardWeights, kUpdateOp})
    plan->impl[op] = own;
  plan->impl[kPoolBackward] = own + " (fused into conv2 backward, timed there)";
  add_conv2_forward(b, *plan, buf, isa, params);
  plan->conv2_backward = std::make_unique<Conv2WinogradBackward>(engine, batch, isa);
  plan->impl[kConv2Backward] = plan->conv2_backward->impl();
  add_fc(b, *plan, buf, isa, params, grads);
  return plan;
}

void run(const std::vector<Step>& steps, const dnnl::stream& stream) {
  for (const Step& s : steps) run(s, stream);
}

bool is_reference(std::string_view impl) {
  // Words are separated by the ':', ' ', '+' and ',' of implementation strings.
  std::size_t start = 0;
  while (start < impl.size()) {
    const std::size_t end = std::min(impl.find_first_of(":+, ", start), impl.size());
    const std::string_view word = impl.substr(start, end - start);
    if (word == "ref" || word.starts_with("ref_")) return true;
    start = end + 1;
  }
  return false;
}

// Once per process: a reference implementation makes training many times slower.
void warn_if_reference(const Plan& plan, const std::string& device) {
  static std::once_flag warned;
  for (int op = 0; op < kOpCount; ++op)
    if (is_reference(plan.impl[op]))
      std::call_once(warned, [&] {
        std::cerr << "mnist_mt: warning: " << device << ": oneDNN runs " << kOpNames[op] << " at batch " << plan.batch
                  << " with a reference implementation (" << plan.impl[op] << "); training will be slow on this CPU\n";
      });
}

}  // namespace mnist_mt::cpu
