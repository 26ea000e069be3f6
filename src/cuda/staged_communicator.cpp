#include "staged_communicator.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "errors.hpp"
#include "cpu/host_group.hpp"
#include "host_signal.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "cpu/stream.hpp"

namespace mnist_mt::cuda {
namespace {

// Floats staged at a time: a whole gradient, so the trainer's collectives go in one piece.
constexpr std::size_t kStageFloats = kParamCount;
// Written to every rank's release word on abort: every waiting stream goes on.
constexpr std::uint32_t kReleaseAll = std::numeric_limits<std::uint32_t>::max();

class StagedCommunicator;

// What the ranks share: the host group, and each rank, so that an abort releases them all.
struct StagedGroup {
  explicit StagedGroup(int size) : host(size) {}
  void abort() noexcept;
  void join(StagedCommunicator* rank) {
    const std::lock_guard lock(mutex);
    ranks.push_back(rank);
  }
  void leave(StagedCommunicator* rank) noexcept {
    const std::lock_guard lock(mutex);
    std::erase(ranks, rank);
  }

  cpu::HostGroup host;
  std::shared_ptr<std::atomic<bool>> aborted = std::make_shared<std::atomic<bool>>(false);
  std::mutex mutex;  // guards ranks
  std::vector<StagedCommunicator*> ranks;
};

// The word only grows, so a collective finishing as an abort lands cannot undo the
// abort's release of every waiting stream.
void raise_to(std::uint32_t& word, std::uint32_t value) noexcept {
  std::atomic_ref<std::uint32_t> w(word);
  std::uint32_t seen = w.load(std::memory_order_relaxed);
  while (seen < value && !w.compare_exchange_weak(seen, value, std::memory_order_release)) {
  }
}

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::shared_ptr<StagedGroup> group, int rank, CudaDevice& device)
      : group_(std::move(group)),
        rank_(rank),
        device_(device),
        stage_(kStageFloats),
        release_(1),
        host_(device.name() + " rank " + std::to_string(rank) + " staging") {
    *release_.data() = 0;
  }

  ~StagedCommunicator() override {
    host_.wait_quiet(host_.ticket());  // errors were reported where they happened
    group_->leave(this);
  }
  StagedCommunicator(const StagedCommunicator&) = delete;
  StagedCommunicator& operator=(const StagedCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return group_->host.size(); }

  void allreduce(float* data, std::size_t count, ReduceOp op) override {
    staged(data, count, [op](cpu::HostGroup& g, int r, float* s, std::size_t n) { g.allreduce(r, s, n, op); });
  }
  void broadcast(float* data, std::size_t count, int root) override {
    staged(data, count, [root](cpu::HostGroup& g, int r, float* s, std::size_t n) { g.broadcast(r, s, n, root); });
  }
  void reduce(float* data, std::size_t count, ReduceOp op, int root) override {
    staged(data, count,
           [op, root](cpu::HostGroup& g, int r, float* s, std::size_t n) { g.reduce(r, s, n, op, root); });
  }
  void scatter(float* data, std::span<const std::size_t> counts, int root) override {
    chunked(data, counts, root, [root](cpu::HostGroup& g, int r, float* s, std::span<const std::size_t> c) {
      g.scatter(r, s, c, root);
    });
  }
  void gather(float* data, std::span<const std::size_t> counts, int root) override {
    chunked(data, counts, root, [root](cpu::HostGroup& g, int r, float* s, std::span<const std::size_t> c) {
      g.gather(r, s, c, root);
    });
  }
  void barrier() override {
    staged(nullptr, 0, [](cpu::HostGroup& g, int, float*, std::size_t) { g.barrier(); });
  }
  void allreduce_host(std::span<double> data) override {
    throw_if_aborted();
    host_.wait(host_.enqueue([this, data] { guarded([&] { group_->host.allreduce_host(rank_, data); }); }));
  }
  void abort() override { group_->abort(); }

  // Any thread, from the group's abort: every wait of this rank, on the host or on the
  // device, ends now and later.
  void release_all() noexcept {
    {
      const std::lock_guard lock(mutex_);
      aborted_ = true;
    }
    staged_cv_.notify_all();
    raise_to(*release_.data(), kReleaseAll);
  }

 private:
  // Collective number k of this rank: the comm stream copies the buffer to the stage and
  // tells the host thread; the host thread runs `body` with the peers on the stage and
  // writes k to the release word; the comm stream, waiting for that word, copies the
  // stage back. Larger buffers go through the stage in pieces, one collective each.
  template <typename Body>
  void staged(float* data, std::size_t count, Body body) {
    throw_if_aborted();
    device_.activate();
    const cudaStream_t stream = device_.comm();
    std::size_t at = 0;
    do {
      const std::size_t n = std::min(kStageFloats, count - at);
      const std::uint32_t k = ++issued_;
      if (n > 0) CUDA_CHECK(cudaMemcpyAsync(stage_.data(), data + at, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
      CUDA_CHECK(cudaLaunchHostFunc(stream, &StagedCommunicator::on_staged, this));
      host_.enqueue([this, k, n, body] {
        guarded([&] {
          wait_staged(k);
          body(group_->host, rank_, stage_.data(), n);
        });
        raise_to(*release_.data(), k);
      });
      wait_for_host(release_.data(), k, stream);
      if (n > 0) CUDA_CHECK(cudaMemcpyAsync(data + at, stage_.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
      at += n;
    } while (at < count);
  }

  // A scatter or gather goes through the stage in one piece: root stages every chunk,
  // the others their own.
  template <typename Body>
  void chunked(float* data, std::span<const std::size_t> counts, int root, Body body) {
    check_chunks(*this, counts, root);
    std::size_t total = 0;
    for (const std::size_t n : counts) total += n;
    if (total > kStageFloats)
      throw RuntimeFailure(device_.name() + " rank " + std::to_string(rank_) + ": a scatter or gather of " +
                           std::to_string(total) + " floats exceeds the staging buffer of " +
                           std::to_string(kStageFloats) + " (ranks sharing a GPU)");
    const std::size_t mine = rank_ == root ? total : counts[static_cast<std::size_t>(rank_)];
    staged(data, mine, [c = std::vector<std::size_t>(counts.begin(), counts.end()), body](
                           cpu::HostGroup& g, int r, float* stage, std::size_t) { body(g, r, stage, c); });
  }

  // On CUDA's host-function thread, in the comm stream's order: the stage holds
  // collective number `staged_ + 1`. Neither blocks nor calls CUDA, as CUDA requires.
  static void on_staged(void* self) {
    auto* c = static_cast<StagedCommunicator*>(self);
    {
      const std::lock_guard lock(c->mutex_);
      ++c->staged_;
    }
    c->staged_cv_.notify_all();
  }

  void wait_staged(std::uint32_t k) {
    std::unique_lock lock(mutex_);
    staged_cv_.wait(lock, [&] { return aborted_ || staged_ >= k; });
    if (staged_ < k) throw_if_aborted();
  }

  // A failure on the host thread aborts the group: the peers, and this rank's own comm
  // stream, must not wait for a collective that will never complete.
  template <typename Call>
  void guarded(Call&& call) {
    try {
      call();
    } catch (...) {
      group_->abort();
      throw;
    }
  }

  void throw_if_aborted() const {
    if (group_->aborted->load(std::memory_order_acquire))
      throw Aborted(device_.name() + " rank " + std::to_string(rank_) + ": collective released, the group was aborted");
  }

  std::shared_ptr<StagedGroup> group_;
  int rank_;
  CudaDevice& device_;  // outlives its communicator
  PinnedBuffer<float> stage_;
  PinnedBuffer<std::uint32_t> release_;  // the last collective the host thread finished
  std::uint32_t issued_ = 0;             // collectives enqueued; the caller's thread only
  std::mutex mutex_;
  std::condition_variable staged_cv_;
  std::uint32_t staged_ = 0;  // collectives whose buffer reached the stage
  bool aborted_ = false;
  cpu::Stream host_;  // declared last: drained before the buffers it uses are freed
};

void StagedGroup::abort() noexcept {
  if (aborted->exchange(true, std::memory_order_acq_rel)) return;
  host.abort();
  const std::lock_guard lock(mutex);
  for (StagedCommunicator* r : ranks) r->release_all();
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_staged_communicators(std::span<CudaDevice* const> devices) {
  // Each staged collective holds its rank's comm stream in a kernel that waits for the
  // peers, which share the GPU and so the context. CUDA loads a kernel at its first launch
  // unless told to load every kernel at start, and that load may wait for the context's
  // running kernels: a peer's first launch would wait for this wait, which waits for it.
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  if (loading == nullptr || std::string(loading) != "EAGER") {
    throw InputError("ranks that share a GPU need CUDA_MODULE_LOADING=EAGER in the environment (set before the "
                     "first CUDA call): a kernel loaded lazily could wait for a peer's kernel that waits for it");
  }
  auto group = std::make_shared<StagedGroup>(static_cast<int>(devices.size()));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (std::size_t rank = 0; rank < devices.size(); ++rank) {
    CudaDevice& device = *devices[rank];
    device.join_group(group->aborted, {});
    device.activate();
    auto comm = std::make_unique<StagedCommunicator>(group, static_cast<int>(rank), device);
    group->join(comm.get());
    comms.push_back(std::move(comm));
  }
  return comms;
}

}  // namespace mnist_mt::cuda
