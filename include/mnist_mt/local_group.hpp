#pragma once
// Collectives among ranks that share a device (docs/architecture.md decision 3), written against
// Device alone, so that the same code serves CPU and CUDA devices.
//
// Each call meets the peers' calls on the host, in a rendezvous that abort() ends. A rank
// records an event on its comm stream as it arrives; the last rank to arrive enqueues, on
// its own comm stream, a wait for every peer's arrival, the operation over the peers'
// buffers (a reduction in rank order, or copies), and a completion event; every other
// rank's comm stream waits for that event. Every wait names an event recorded already, so
// the host's order of enqueueing is an order the devices can follow: no stream ever
// waits on the host, whatever the streams share. Sums are the CPU communicator's, bit
// for bit: each element adds rank 0's value, then rank 1's, and so on.
#include <memory>
#include <span>
#include <vector>

#include "mnist_mt/communicator.hpp"
#include "mnist_mt/device.hpp"

namespace mnist_mt {

// Main thread: one communicator per device, rank i on devices[i], in one process; the
// devices outlive the communicators. `shards`: the buffers each rank passes to
// allreduce_shards (Place::shards; empty: one each). Outside a local_group_start/end
// bracket, a collective returns once every peer has arrived (the last to arrive returns
// at once), so each rank needs a thread of its own.
std::vector<std::unique_ptr<Communicator>> make_local_communicators(std::span<Device* const> devices,
                                                                    std::vector<int> shards = {});

// One thread driving several ranks brackets their calls, as ncclGroupStart/End do: inside,
// a call never waits for its peers; the outermost local_group_end() completes every call
// the bracket made, and throws the first error among them. Nestable; per thread.
void local_group_start();
void local_group_end();

}  // namespace mnist_mt
