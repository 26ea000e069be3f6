#include "device.hpp"

#include <omp.h>
#include <pmmintrin.h>
#include <xmmintrin.h>

#include <pthread.h>
#include <sched.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cpu {
namespace {

struct CpuEvent final : DeviceEvent {
  Stream* stream = nullptr;  // none until recorded
  std::uint64_t ticket = 0;
};

// CpuEvent& or const CpuEvent&, as `event` is.
template <typename Event>
auto& cpu_event(Event& event) {
  auto* e = dynamic_cast<std::conditional_t<std::is_const_v<Event>, const CpuEvent, CpuEvent>*>(&event);
  if (e == nullptr) throw RuntimeFailure("an event of another kind of device given to a CPU device");
  return *e;
}

// The calling thread (`name`'s) runs on `core` only, when given. A failure leaves it
// where it was, with a warning: pinning is a matter of speed, not of results.
void run_on(std::optional<int> core, const std::string& name) {
  if (!core) return;
  int error = EINVAL;
  if (*core >= 0) {
    const auto cpus = static_cast<std::size_t>(*core) + 1;
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set != nullptr) {
      const std::size_t size = CPU_ALLOC_SIZE(cpus);
      CPU_ZERO_S(size, set);
      CPU_SET_S(static_cast<std::size_t>(*core), size, set);
      error = pthread_setaffinity_np(pthread_self(), size, set);
      CPU_FREE(set);
    } else {
      error = ENOMEM;
    }
  }
  if (error != 0) {  // one write: the device's other thread may warn at the same moment
    const std::string line = "mnist_mt: warning: " + name + " runs unpinned: CPU " + std::to_string(*core) + ": " +
                             std::strerror(error) + "\n";
    std::cerr << line << std::flush;
  }
}

}  // namespace

CpuDevice::CpuDevice(int id, std::optional<int> core)
    : id_(id),
      compute_("cpu:" + std::to_string(id) + " compute", [core, id] {
                   run_on(core, "cpu:" + std::to_string(id) + " compute");
                   omp_set_num_threads(1);
                   // Momentum decays unused weights' buffers into denormals after ~800 steps,
                   // which would make every update several times slower: flush them to zero.
                   _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
                   _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
                 }),
      comm_("cpu:" + std::to_string(id) + " comm", [core, id] { run_on(core, "cpu:" + std::to_string(id) + " comm"); }) {}

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

std::unique_ptr<DeviceEvent> CpuDevice::make_event() { return std::make_unique<CpuEvent>(); }

void CpuDevice::record(Lane which, DeviceEvent& event) {
  CpuEvent& e = cpu_event(event);
  e.stream = &lane(which);
  e.ticket = e.stream->ticket();
}

void CpuDevice::wait_for(Lane which, const DeviceEvent& event) {
  const CpuEvent& e = cpu_event(event);
  if (e.stream == nullptr) throw RuntimeFailure(name() + ": a wait for an event never recorded");
  lane(which).enqueue_wait(*e.stream, e.ticket);
}

void CpuDevice::reduce(Lane which, std::span<const float* const> in, std::span<float* const> out, std::size_t count,
                       ReduceOp op, std::size_t divisor) {
  lane(which).enqueue([in = std::vector<const float*>(in.begin(), in.end()),
                       out = std::vector<float*>(out.begin(), out.end()), count, op, divisor] {
    if (count > 0) reduce_in_order(in, 0, count, out, op, divisor);
  });
}

void CpuDevice::copy(Lane which, float* to, const float* from, std::size_t count) {
  lane(which).enqueue([to, from, count] {
    if (count > 0) std::memcpy(to, from, count * sizeof(float));
  });
}

}  // namespace mnist_mt::cpu
