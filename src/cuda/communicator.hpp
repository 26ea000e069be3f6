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
// devices[i], from ncclCommInitRankConfig inside ncclGroupStart/End (as ncclCommInitAll
// does), the ncclUniqueId made by world rank 0's process and, with several processes
// (every one calls it), sent over MPI. With several processes the communicators are
// non-blocking: their initialisation, then a first round of every collective, each finish
// within place.timeout_s (0: no limit) or end in a RuntimeFailure naming the ranks and the
// phase ("init", "first collective"), every communicator aborted. In one process, whose
// peers are its own threads, they block, as ncclCommInitAll's do.
// Every collective runs on its rank's comm stream. abort() on any of them aborts the
// whole group, as the CPU communicator does, so no rank is left waiting for a peer.
// allreduce_host() blocks its caller until every rank has called it, so one thread
// cannot drive several ranks through it. `record`: the devices' steps may be recorded as
// CUDA graphs (CudaDevice::allow_record), which ranks that share a GPU never are.
std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<CudaDevice* const> devices, bool record,
                                                              const Place& place);

// Backend::group_start/group_end: ncclGroupStart/End around calls on these communicators
// from one thread. Non-blocking ones may still be issuing the group's work when
// ncclGroupEnd returns (ncclInProgress, no error): the outermost end waits until NCCL has
// put it on every stream, as a blocking ncclGroupEnd does.
void start_nccl_group();
void end_nccl_group();

}  // namespace mnist_mt::cuda
