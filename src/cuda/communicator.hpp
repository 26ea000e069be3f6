#pragma once
// NCCL collectives among the GPUs of this process (include/mnist_mt/communicator.hpp).
#include <memory>
#include <span>
#include <vector>

#include "device.hpp"
#include "mnist_mt/communicator.hpp"
#include "mnist_mt/processes.hpp"

namespace mnist_mt::cuda {

// Main thread: one communicator per device, world rank place.first_rank + i on
// devices[i]: from ncclCommInitAll in one process; with several processes (every one
// calls it), from ncclCommInitRank inside ncclGroupStart/End, the ncclUniqueId made by
// world rank 0's process and broadcast over MPI.
// Every collective runs on its rank's comm stream. abort() on any of them aborts the
// whole group, as the CPU communicator does, so no rank is left waiting for a peer.
// allreduce_host() blocks its caller until every rank has called it, so one thread
// cannot drive several ranks through it. `record`: the devices' steps may be recorded as
// CUDA graphs (CudaDevice::allow_record), which ranks that share a GPU never are.
std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<CudaDevice* const> devices, bool record,
                                                              const Place& place);

}  // namespace mnist_mt::cuda
