#include "device.hpp"

#include <omp.h>

namespace mnist_mt::cpu {

CpuDevice::CpuDevice(int id)
    : id_(id),
      compute_("cpu:" + std::to_string(id) + " compute", [] { omp_set_num_threads(1); }),
      comm_("cpu:" + std::to_string(id) + " comm") {}

void CpuDevice::synchronize() {
  // Both streams drain even when one has failed; the compute error comes first.
  std::exception_ptr first;
  for (Stream* s : {&compute_, &comm_}) {
    try {
      s->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace mnist_mt::cpu
