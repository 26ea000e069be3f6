// A build without MPI: one process as before, and a clear refusal of a launch of several.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "mnist_mt/error.hpp"
#include "mnist_mt/processes.hpp"

namespace {

TEST(NoMpi, RunsAsOneProcessAndRefusesALaunchOfSeveral) {
  int argc = 1;
  char name[] = "mnist_mt";
  char* args[] = {name, nullptr};
  char** argv = args;
  EXPECT_FALSE(mnist_mt::mpi_built());
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) ::unsetenv(variable);
  EXPECT_EQ(mnist_mt::join_launch(argc, argv, 0), nullptr);
  ::setenv("SLURM_STEP_NUM_TASKS", "1", 1);  // srun -n 1: one process
  EXPECT_EQ(mnist_mt::join_launch(argc, argv, 0), nullptr);
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    ::setenv(variable, "4", 1);
    try {
      mnist_mt::join_launch(argc, argv, 0);
      ADD_FAILURE() << variable << "=4 was not refused";
    } catch (const mnist_mt::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("started as one of 4 processes by mpirun/srun, but this build has no MPI"),
                std::string::npos)
          << e.what();
    }
    ::unsetenv(variable);
  }
}

}  // namespace
