#pragma once
// Collectives among ranks that share a GPU, which NCCL refuses (one communicator per
// device): each rank stages its buffer through pinned host memory and meets its peers in
// the CPU backend's in-process group (cpu/host_group.hpp), on a host thread of its own.
// The rank's comm stream waits for that thread on the device (host_signal.hpp), so every
// call returns at once and is ordered on the comm stream as NCCL's are, and one thread
// may drive every rank (the DataParallel baseline). Sums are the host group's: in rank
// order, bitwise reproducible. It exists so that the multi-rank GPU code paths run, and
// are tested, on a host with one GPU; it is not fast.
#include <memory>
#include <span>
#include <vector>

#include "device.hpp"
#include "mnist_mt/communicator.hpp"

namespace mnist_mt::cuda {

// Main thread: one communicator per device, rank i on devices[i]; devices may repeat.
std::vector<std::unique_ptr<Communicator>> make_staged_communicators(std::span<CudaDevice* const> devices);

}  // namespace mnist_mt::cuda
