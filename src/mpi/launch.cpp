// What every build shares: the launcher's word from the environment, and the exchange
// with a deadline.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mnist_mt/error.hpp"
#include "mnist_mt/processes.hpp"

namespace mnist_mt {

// Open MPI sets OMPI_COMM_WORLD_SIZE; MPICH's and Intel's mpiexec, PMI_SIZE; srun,
// SLURM_STEP_NUM_TASKS inside a job step (not in the batch script itself).
int launcher_processes() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long n = std::strtol(value, &end, 10);
    if (*end == '\0' && n > 0 && n < (1L << 24)) return static_cast<int>(n);
  }
  return 0;
}

std::string process_names(const Processes& processes, const std::vector<int>& which, int ranks_per_process) {
  std::string text;
  for (const int p : which) {
    std::string ranks;
    if (ranks_per_process == 1) {
      ranks = ", rank " + std::to_string(p);
    } else if (ranks_per_process > 1) {
      ranks = ", ranks " + std::to_string(p * ranks_per_process) + "-" +
              std::to_string(p * ranks_per_process + ranks_per_process - 1);
    }
    text += (text.empty() ? "process " : ", process ") + std::to_string(p) + " (host " + processes.host(p) + ranks + ")";
  }
  return text;
}

void allgather_within(Processes& processes, const void* mine, void* all, std::size_t bytes, double timeout_s,
                      const std::string& when) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::vector<int> missing;
  try {
    processes.allgather(mine, all, bytes, [&] {
      if (timeout_s <= 0 || std::chrono::steady_clock::now() < deadline) return false;
      missing = processes.waiting_for();
      return true;
    });
  } catch (const Aborted&) {
    char limit[32];
    std::snprintf(limit, sizeof limit, "%.3g", timeout_s);
    throw RuntimeFailure("process " + std::to_string(processes.index()) + ": nothing came from " +
                         process_names(processes, missing) + " within " + limit + " s (--timeout) " + when +
                         ": it failed or stopped");
  }
}

}  // namespace mnist_mt
