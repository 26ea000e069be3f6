#include "communicator.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "host_group.hpp"

namespace mnist_mt::cpu {
namespace {

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<HostGroup> group, CpuDevice& device, int rank, int first_rank)
      : group_(std::move(group)), device_(device), rank_(rank), first_rank_(first_rank) {}

  int rank() const override { return first_rank_ + rank_; }
  int size() const override { return group_->world(); }

  void allreduce(float* data, std::size_t count, ReduceOp op) override {
    enqueue([g = group_, r = rank_, data, count, op, sum = squares_] { *sum += g->allreduce(r, data, count, op); });
  }
  void allreduce_shards(std::span<float* const> shards, std::size_t count, ReduceOp op) override {
    enqueue([g = group_, r = rank_, parts = std::vector<float*>(shards.begin(), shards.end()), count, op,
             sum = squares_] { *sum += g->allreduce(r, parts, count, op); });
  }
  void broadcast(float* data, std::size_t count, int root) override {
    enqueue([g = group_, r = rank_, data, count, root] { g->broadcast(r, data, count, root); });
  }
  void reduce(float* data, std::size_t count, ReduceOp op, int root) override {
    enqueue([g = group_, r = rank_, data, count, op, root, sum = squares_] {
      *sum += g->reduce(r, data, count, op, root);
    });
  }
  void scatter(float* data, std::span<const std::size_t> counts, int root) override {
    check_chunks(*this, counts, root);
    enqueue([g = group_, r = rank_, data, c = std::vector<std::size_t>(counts.begin(), counts.end()), root] {
      g->scatter(r, data, c, root);
    });
  }
  void gather(float* data, std::span<const std::size_t> counts, int root) override {
    check_chunks(*this, counts, root);
    enqueue([g = group_, r = rank_, data, c = std::vector<std::size_t>(counts.begin(), counts.end()), root] {
      g->gather(r, data, c, root);
    });
  }
  void allgather(const float* mine, float* all, std::size_t count) override {
    enqueue([g = group_, r = rank_, mine, all, count] { g->allgather(r, mine, all, count); });
  }
  void barrier() override {
    enqueue([g = group_, r = rank_] { g->world_barrier(r); });
  }
  void allreduce_host(std::span<double> data) override {
    device_.comm().wait(enqueue([g = group_, r = rank_, data] { g->allreduce_host(r, data); }));
  }
  // The comm thread adds to it; with the stream drained, the caller reads it.
  std::optional<double> take_reduced_squares() override { return std::exchange(*squares_, 0.0); }
  bool keeps_reduced_squares() const override { return true; }
  void abort() override { group_->abort(); }

 private:
  std::uint64_t enqueue(std::function<void()> task) { return device_.comm().enqueue(std::move(task)); }

  std::shared_ptr<HostGroup> group_;
  CpuDevice& device_;
  int rank_;  // in this process
  int first_rank_;
  // Shared with the queued allreduces, which may run on after a failure left this behind.
  std::shared_ptr<double> squares_ = std::make_shared<double>(0.0);
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<CpuDevice* const> devices, const Place& place) {
  auto group = std::make_shared<HostGroup>(static_cast<int>(devices.size()), place.processes, place.shards);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(devices.size());
  for (std::size_t r = 0; r < devices.size(); ++r) {
    comms.push_back(std::make_unique<CpuCommunicator>(group, *devices[r], static_cast<int>(r), place.first_rank));
  }
  return comms;
}

}  // namespace mnist_mt::cpu
