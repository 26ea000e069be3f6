#pragma once
// What a launcher (mpirun, srun, mpiexec) tells the processes it starts, read from the
// environment before MPI is initialised.
#include <cstdlib>
#include <string>

namespace mnist_mt {

// The processes the launcher started, or 0 without a launcher. Open MPI sets
// OMPI_COMM_WORLD_SIZE; MPICH's and Intel's mpiexec, PMI_SIZE; srun, SLURM_STEP_NUM_TASKS
// inside a job step (not in the batch script itself, where SLURM_NTASKS is set too).
inline int launcher_processes() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long n = std::strtol(value, &end, 10);
    if (*end == '\0' && n > 0 && n < (1L << 24)) return static_cast<int>(n);
  }
  return 0;
}

}  // namespace mnist_mt
