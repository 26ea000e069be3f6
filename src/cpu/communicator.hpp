#pragma once
// In-process collectives over shared memory (docs/architecture.md decisions 1 and 10). The ranks'
// communicators share one group; each collective runs on the calling rank's comm
// stream, and the W comm-stream threads meet at an abortable barrier.
#include <memory>
#include <span>
#include <vector>

#include "device.hpp"
#include "mnist_mt/communicator.hpp"
#include "mnist_mt/processes.hpp"

namespace mnist_mt::cpu {

// One communicator per device, world rank place.first_rank + i on devices[i], all in one
// group (with place.processes: the world's, HostGroup). Sums add each element in rank
// order 0..W-1 whatever the count or chunking (across processes: each process's sum, in
// process order), so results are bitwise reproducible; an average is that sum divided
// by W. With place.shards, allreduce_shards() adds each rank's shards in turn, as a
// world of a rank per shard would, and divides by the world's shards. allreduce_host()
// blocks its caller until every rank has called it, so one thread cannot drive several
// ranks through it.
std::vector<std::unique_ptr<Communicator>> make_communicators(std::span<CpuDevice* const> devices,
                                                              const Place& place = {});

}  // namespace mnist_mt::cpu
