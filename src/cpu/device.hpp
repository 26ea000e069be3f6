#pragma once
#include <array>
#include <optional>
#include <string>

#include "mnist_mt/device.hpp"
#include "stream.hpp"

namespace mnist_mt::cpu {

// A CPU device: one compute stream whose thread runs oneDNN single-threaded (one core
// per rank), and one comm stream; with `core`, both threads run on that CPU only.
class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int id, std::optional<int> core = std::nullopt);
  ~CpuDevice() override;
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;
  void activate() override {}
  void comm_wait_compute() override { comm_.enqueue_wait(compute_, compute_.ticket()); }
  void compute_wait_comm() override { compute_.enqueue_wait(comm_, comm_.ticket()); }
  void synchronize() override;
  void wait_compute() override { compute_.synchronize(); }
  std::string name() const override { return "cpu:" + std::to_string(id_); }
  TimeMark mark(Lane lane) override;
  std::optional<double> mark_time(const TimeMark& mark) override;
  std::optional<double> elapsed(const TimeMark& from, const TimeMark& to) override;
  // An event is a stream and a ticket of it; waiting for it is Stream::enqueue_wait.
  std::unique_ptr<DeviceEvent> make_event() override;
  void record(Lane lane, DeviceEvent& event) override;
  void wait_for(Lane lane, const DeviceEvent& event) override;
  void reduce(Lane lane, std::span<const float* const> in, std::span<float* const> out, std::size_t count,
              ReduceOp op, std::size_t divisor) override;
  void copy(Lane lane, float* to, const float* from, std::size_t count) override;

  Stream& compute() { return compute_; }
  Stream& comm() { return comm_; }
  int id() const { return id_; }

 private:
  Stream& lane(Lane lane) { return lane == Lane::kCompute ? compute_ : comm_; }

  int id_;
  // Slot id % kMarks: the mark's ticket (host side) and the moment its task ran (written on
  // the stream's thread, read once the ticket has passed).
  std::array<std::uint64_t, kMarks> mark_tickets_{};
  std::array<double, kMarks> mark_seconds_{};
  std::uint64_t marks_ = 0;
  Stream compute_;
  Stream comm_;
};

}  // namespace mnist_mt::cpu
