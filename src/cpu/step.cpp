#include "step.hpp"

#include <string>

namespace mnist_mt::cpu {

void run(const Step& step, const dnnl::stream& stream) {
  const dnnl_status_t status = dnnl_primitive_execute(step.primitive.get(), stream.get(),
                                                      static_cast<int>(step.args.size()), step.args.data());
  if (status != dnnl_success)
    throw RuntimeFailure(std::string("oneDNN: ") + (step.op < kOpCount ? kOpNames[step.op] : "primitive") +
                         " failed with status " + std::to_string(status));
}

}  // namespace mnist_mt::cpu
