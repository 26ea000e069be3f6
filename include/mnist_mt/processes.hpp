#pragma once
// The processes of a run launched by MPI (`mpirun`, `srun`), each with its own devices as
// ranks (docs/architecture.md decision 11): the world is every rank of every process, numbered
// process-major. Without a launcher there is one process and no Processes object.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mnist_mt/error.hpp"

namespace mnist_mt {

class Processes {
 public:
  virtual ~Processes() = default;
  virtual int index() const = 0;  // this process, 0..count()-1 (its MPI rank)
  virtual int count() const = 0;
  virtual const std::string& host(int process) const = 0;

  // One thread of each process at a time, every process the same calls in the same
  // order. Blocks until done; polls `stop` meanwhile and throws Aborted once it is true.
  // allgather: every process's `bytes` bytes of `mine`, in process order, into `all`
  // (count() * bytes; `mine` may be this process's place in it).
  virtual void allgather(const void* mine, void* all, std::size_t bytes, const std::function<bool()>& stop) = 0;
  // root's `bytes` bytes of `data` into every process's `data`.
  virtual void broadcast(void* data, std::size_t bytes, int root, const std::function<bool()>& stop) = 0;

  // Any thread: the processes that an allgather or broadcast under way still waits for,
  // in order; empty when none is under way or none is missing.
  virtual std::vector<int> waiting_for() const = 0;

  // Ends every process of the launch (MPI_Abort) with exit code `code`.
  [[noreturn]] virtual void abort(int code) = 0;
};

// A bad input that every process of a launch finds alike (the same flags, the same
// exchange): world rank 0's process reports it and ends the launch; the others end
// without a word.
class SameOnEveryProcess : public InputError {
 public:
  using InputError::InputError;
};

// The launch this process is part of: null without a launcher, or under one that started
// just this process. Initialises MPI (MPI_THREAD_MULTIPLE) only then, and learns every
// process's host within `timeout_s` seconds (0: no limit); the object's destructor
// finalises MPI. Throws InputError when the build has no MPI and a launcher started
// several processes, or when MPI lacks MPI_THREAD_MULTIPLE; ends the launch (MPI_Abort)
// when anything fails once MPI is initialised.
std::shared_ptr<Processes> join_launch(int& argc, char**& argv, double timeout_s);
bool mpi_built();
// The processes a launcher (mpirun, srun, mpiexec) says it started, from the environment,
// before MPI is initialised; 0 without a launcher.
int launcher_processes();

// "process P (host H, rank R)" for each of `which`, comma-separated: ranks R of
// `ranks_per_process` each, numbered process-major (0: no ranks named).
std::string process_names(const Processes& processes, const std::vector<int>& which, int ranks_per_process = 0);

// Processes::allgather that gives up after `timeout_s` seconds (0: never) with a
// RuntimeFailure naming the processes not heard from and `when` ("while the processes
// set up").
void allgather_within(Processes& processes, const void* mine, void* all, std::size_t bytes, double timeout_s,
                      const std::string& when);

// Where this process's ranks are in the world.
struct Place {
  std::shared_ptr<Processes> processes;  // null: one process
  int first_rank = 0;                    // the world rank of this process's rank 0
  int world = 0;                         // ranks in all; 0: this process's ranks
  double timeout_s = 0;                  // how long a setup exchange waits (0: no limit)
  // The shards of the world's batch each of this process's ranks computes in turn (empty:
  // one each; one process only): the gradient allreduce adds every shard in world order,
  // as a world of a rank per shard would (Communicator::allreduce_shards).
  std::vector<int> shards;
  int process() const { return processes ? processes->index() : 0; }
  int process_count() const { return processes ? processes->count() : 1; }
};

}  // namespace mnist_mt
