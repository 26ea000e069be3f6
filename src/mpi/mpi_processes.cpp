// The processes of an MPI launch (include/mnist_mt/processes.hpp). Transfers are
// nonblocking point-to-point messages polled until done, so that a collective can be
// released by an abort (MPI cannot cancel a blocking collective) and can say which
// processes it still waits for.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mnist_mt/error.hpp"
#include "mnist_mt/processes.hpp"
#include "mnist_mt/version.hpp"

namespace mnist_mt {
namespace {

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

void mpi_check(int code, const char* call) {
  if (code != MPI_SUCCESS) throw RuntimeFailure(std::string(call) + ": " + mpi_error(code));
}

class MpiProcesses final : public Processes {
 public:
  // MPI is initialised; the caller finalises it if this throws.
  explicit MpiProcesses(double timeout_s) {
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &index_);
    MPI_Comm_size(comm_, &count_);
    hosts_.assign(static_cast<std::size_t>(count_), "?");
    std::array<char, 256> mine{};
    if (::gethostname(mine.data(), mine.size() - 1) != 0) std::snprintf(mine.data(), mine.size(), "unknown");
    std::vector<char> all(mine.size() * static_cast<std::size_t>(count_));
    allgather_within(*this, mine.data(), all.data(), mine.size(), timeout_s, "while MPI started");
    for (int p = 0; p < count_; ++p) hosts_[static_cast<std::size_t>(p)] = all.data() + mine.size() * static_cast<std::size_t>(p);
  }

  ~MpiProcesses() override {
    MPI_Comm_free(&comm_);
    MPI_Finalize();
  }

  int index() const override { return index_; }
  int count() const override { return count_; }
  const std::string& host(int process) const override { return hosts_.at(static_cast<std::size_t>(process)); }

  // The messages go from and to the transfer's own buffers (one copy each way), which an
  // abort leaves to MPI until the process ends: a message still under way never writes
  // into memory its caller has freed.
  void allgather(const void* mine, void* all, std::size_t bytes, const std::function<bool()>& stop) override {
    auto* out = static_cast<char*>(all);
    Transfer t(*this, bytes);
    const char* outgoing = t.outgoing(mine);
    for (int p = 0; p < count_; ++p) {
      if (p == index_) continue;
      t.receive(p);
      t.send(outgoing, p);
    }
    t.finish(stop);
    for (int p = 0; p < count_; ++p) {
      char* to = out + bytes * static_cast<std::size_t>(p);
      if (p == index_) {
        if (to != mine && bytes > 0) std::memmove(to, mine, bytes);
      } else {
        t.take(p, to);
      }
    }
  }

  void broadcast(void* data, std::size_t bytes, int root, const std::function<bool()>& stop) override {
    Transfer t(*this, bytes);
    if (index_ == root) {
      const char* outgoing = t.outgoing(data);
      for (int p = 0; p < count_; ++p) {
        if (p != root) t.send(outgoing, p);
      }
      t.finish(stop);
    } else {
      t.receive(root);
      t.finish(stop);
      t.take(root, static_cast<char*>(data));
    }
  }

  std::vector<int> waiting_for() const override {
    const std::lock_guard lock(waiting_mutex_);
    return waiting_;
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  // One collective's messages: posted, then polled until every one is done.
  class Transfer {
   public:
    Transfer(MpiProcesses& owner, std::size_t bytes)
        : owner_(owner), tag_(owner.next_tag()), bytes_(bytes), buffers_(std::make_shared<Buffers>()) {
      buffers_->resize(static_cast<std::size_t>(owner.count_));
    }
    ~Transfer() {
      {
        const std::lock_guard lock(owner_.waiting_mutex_);
        owner_.waiting_.clear();
      }
      // Messages left under way (an abort): their buffers live as long as the process.
      if (std::any_of(peers_.begin(), peers_.end(), [](int p) { return p >= 0; })) {
        const std::lock_guard lock(owner_.abandoned_mutex_);
        owner_.abandoned_.push_back(buffers_);
      }
    }

    // `data` copied into this process's own buffer, which the sends read.
    const char* outgoing(const void* data) {
      std::vector<char>& own = (*buffers_)[static_cast<std::size_t>(owner_.index_)];
      own.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes_);
      return own.data();
    }
    void send(const char* outgoing, int peer) {
      post(MPI_Isend(outgoing, count(bytes_), MPI_BYTE, peer, tag_, owner_.comm_, &add(peer)), "MPI_Isend");
    }
    void receive(int peer) {
      std::vector<char>& in = (*buffers_)[static_cast<std::size_t>(peer)];
      in.resize(bytes_);
      post(MPI_Irecv(in.data(), count(bytes_), MPI_BYTE, peer, tag_, owner_.comm_, &add(peer)), "MPI_Irecv");
    }
    // After finish(): what came from `peer`.
    void take(int peer, char* to) const {
      if (bytes_ > 0) std::memcpy(to, (*buffers_)[static_cast<std::size_t>(peer)].data(), bytes_);
    }

    // Polls: MPI progresses the messages inside MPI_Testsome; a short spin, then short
    // sleeps, so that a waiting process leaves its cores to its ranks' compute.
    void finish(const std::function<bool()>& stop) {
      publish();
      std::vector<int> done(requests_.size());
      std::size_t left = requests_.size();
      for (std::uint64_t poll = 0; left > 0; ++poll) {
        int completed = 0;
        const int code = MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(), &completed, done.data(),
                                      MPI_STATUSES_IGNORE);
        if (code != MPI_SUCCESS) throw RuntimeFailure("MPI_Testsome: " + mpi_error(code));
        if (completed != MPI_UNDEFINED && completed > 0) {
          left -= static_cast<std::size_t>(completed);
          for (int i = 0; i < completed; ++i) peers_[static_cast<std::size_t>(done[static_cast<std::size_t>(i)])] = -1;
          publish();
          continue;
        }
        if (stop()) throw Aborted("exchange between processes released: a rank failed");
        if (poll > 256) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }

   private:
    static int count(std::size_t bytes) {
      if (bytes > static_cast<std::size_t>(INT_MAX))
        throw RuntimeFailure("a message between processes of " + std::to_string(bytes) + " bytes");
      return static_cast<int>(bytes);
    }
    MPI_Request& add(int peer) {
      peers_.push_back(peer);
      return requests_.emplace_back(MPI_REQUEST_NULL);
    }
    void post(int code, const char* call) {
      if (code != MPI_SUCCESS) throw RuntimeFailure(std::string(call) + ": " + mpi_error(code));
    }
    // The peers with a message not yet done, for waiting_for().
    void publish() {
      std::vector<int> waiting;
      for (const int p : peers_) {
        if (p >= 0 && std::find(waiting.begin(), waiting.end(), p) == waiting.end()) waiting.push_back(p);
      }
      std::sort(waiting.begin(), waiting.end());
      const std::lock_guard lock(owner_.waiting_mutex_);
      owner_.waiting_ = std::move(waiting);
    }

    using Buffers = std::vector<std::vector<char>>;  // by process
    MpiProcesses& owner_;
    const int tag_;
    const std::size_t bytes_;
    std::shared_ptr<Buffers> buffers_;
    std::vector<MPI_Request> requests_;
    std::vector<int> peers_;  // each request's peer; -1 once done
  };

  int next_tag() { return static_cast<int>(sequence_.fetch_add(1) % 32768); }  // MPI_TAG_UB >= 32767

  MPI_Comm comm_ = MPI_COMM_NULL;
  int index_ = 0;
  int count_ = 1;
  std::vector<std::string> hosts_;
  std::atomic<std::uint64_t> sequence_{0};
  mutable std::mutex waiting_mutex_;
  std::vector<int> waiting_;  // guarded by waiting_mutex_
  std::mutex abandoned_mutex_;
  std::vector<std::shared_ptr<void>> abandoned_;  // guarded by abandoned_mutex_
};

}  // namespace

bool mpi_built() { return true; }

// Callable before MPI_Init: the library's first words ("Open MPI v4.1.4").
LibraryVersion mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return {"MPI", "unknown"};
  std::string words(text, static_cast<std::size_t>(length));
  words = words.substr(0, words.find_first_of(",\n"));
  return {"MPI", words};
}

std::shared_ptr<Processes> join_launch(int& argc, char**& argv, double timeout_s) {
  if (launcher_processes() <= 1) return nullptr;
  int provided = 0;
  mpi_check(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw InputError("the MPI library does not provide MPI_THREAD_MULTIPLE, which a process's ranks need");
  }
  try {
    return std::make_shared<MpiProcesses>(timeout_s);
  } catch (const std::exception& e) {  // the peers may wait for this process: end them too
    std::fprintf(stderr, "mnist_mt: error: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
    std::_Exit(3);
  }
}

}  // namespace mnist_mt
