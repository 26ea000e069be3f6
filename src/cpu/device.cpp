#include "device.hpp"

#include <omp.h>
#include <pmmintrin.h>
#include <xmmintrin.h>

#include <pthread.h>
#include <sched.h>

#include <chrono>

namespace mnist_mt::cpu {
namespace {

// The calling thread runs on `core` only, when given. A failure leaves it where it was:
// pinning is a matter of speed, and the core came from the process's own mask.
void run_on(std::optional<int> core) {
  if (!core || *core < 0 || *core >= CPU_SETSIZE) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(*core, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

}  // namespace

CpuDevice::CpuDevice(int id, std::optional<int> core)
    : id_(id),
      compute_("cpu:" + std::to_string(id) + " compute", [core] {
                   run_on(core);
                   omp_set_num_threads(1);
                   // Momentum decays unused weights' buffers into denormals after ~800 steps,
                   // which would make every update several times slower: flush them to zero.
                   _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
                   _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
                 }),
      comm_("cpu:" + std::to_string(id) + " comm", [core] { run_on(core); }) {}

// comm_ is destroyed first, so compute tasks still queued that wait for it would wait on a
// destroyed stream: they run now, while both streams exist. Comm tasks only wait for
// compute tickets already drained here.
CpuDevice::~CpuDevice() {
  try {
    compute_.synchronize();
  } catch (...) {  // the error was the work's, reported to whoever waited for it
  }
}

TimeMark CpuDevice::mark(Lane which) {
  const TimeMark m{which, marks_++};
  const std::size_t slot = m.id % kMarks;
  mark_tickets_[slot] = lane(which).enqueue([this, slot] {
    mark_seconds_[slot] = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  });
  return m;
}

std::optional<double> CpuDevice::mark_time(const TimeMark& m) {
  const std::size_t slot = m.id % kMarks;
  if (!lane(m.lane).passed(mark_tickets_[slot])) return std::nullopt;
  return mark_seconds_[slot];
}

std::optional<double> CpuDevice::elapsed(const TimeMark& from, const TimeMark& to) {
  const std::optional<double> a = mark_time(from), b = mark_time(to);
  if (!a || !b) return std::nullopt;
  return *b - *a;
}

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
