// A build without MPI: one process, and a clear refusal of a launch of several.
#include <string>

#include "mnist_mt/error.hpp"
#include "mnist_mt/processes.hpp"
#include "mnist_mt/version.hpp"

namespace mnist_mt {

bool mpi_built() { return false; }

LibraryVersion mpi_library_version() { return {"MPI", "not built"}; }

std::shared_ptr<Processes> join_launch(int&, char**&, double) {
  const int processes = launcher_processes();
  if (processes > 1) {
    throw InputError("started as one of " + std::to_string(processes) +
                     " processes by mpirun/srun, but this build has no MPI: install an MPI "
                     "(scripts/setup.sh: Open MPI) and rebuild with meson -Dmpi=enabled");
  }
  return nullptr;
}

}  // namespace mnist_mt
