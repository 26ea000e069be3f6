#pragma once
// Which GPUs each process of a launch takes. The processes that share a host split its
// list by local rank (their index among the host's processes, in process order): n
// processes and a list of L GPUs, L a multiple of n, and local rank i takes the i-th
// slice of L/n, in order. No two processes of one host may then take the same GPU.
// Every process computes every process's share from the same exchanged lists, so each
// finds the same errors. Inline and pure: tests/test_processes.cpp, which links no
// library of src/mpi, tests the rule itself.
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mnist_mt/error.hpp"
#include "mnist_mt/processes.hpp"

namespace mnist_mt {

// Where a process is among the processes on its host.
struct LocalRank {
  int index = 0;  // 0..count-1, in process order
  int count = 1;  // the processes on that host
};

// `hosts[p]`: process p's host.
inline LocalRank local_rank(std::span<const std::string> hosts, int process) {
  LocalRank r{0, 0};
  for (std::size_t p = 0; p < hosts.size(); ++p) {
    if (hosts[p] != hosts[static_cast<std::size_t>(process)]) continue;
    if (static_cast<int>(p) < process) ++r.index;
    ++r.count;
  }
  return r;
}

// "0,1,2"
inline std::string device_list(std::span<const int> ids) {
  std::string text;
  for (const int id : ids) {
    if (!text.empty()) text += ',';
    text += std::to_string(id);
  }
  return text;
}

// Local rank `local_rank` of `local_count`'s slice of `listed`; InputError when the list
// does not split evenly.
inline std::vector<int> devices_for_local_rank(std::span<const int> listed, int local_rank, int local_count) {
  const auto n = static_cast<std::size_t>(local_count);
  if (listed.size() % n != 0) {
    throw InputError("GPUs " + device_list(listed) + " do not split evenly among " + std::to_string(local_count) +
                         " processes",
                     "gpus");
  }
  const std::size_t share = listed.size() / n;
  const auto first = listed.begin() + static_cast<std::ptrdiff_t>(share * static_cast<std::size_t>(local_rank));
  return {first, first + static_cast<std::ptrdiff_t>(share)};
}

// Two processes that take one GPU of one host.
struct DeviceClash {
  int first = 0;
  int second = 0;
  int device = 0;
};

// The first clash in process order (`taken[p]`: process p's GPUs, on `hosts[p]`).
inline std::optional<DeviceClash> find_clash(std::span<const std::string> hosts,
                                             std::span<const std::vector<int>> taken) {
  std::map<std::pair<std::string, int>, int> owner;
  for (std::size_t p = 0; p < taken.size(); ++p) {
    for (const int id : taken[p]) {
      const auto [at, fresh] = owner.try_emplace({hosts[p], id}, static_cast<int>(p));
      if (!fresh) return DeviceClash{at->second, static_cast<int>(p), id};
    }
  }
  return std::nullopt;
}

// "process P (host H)" for each of a list of processes (process_names).
using ProcessNames = std::function<std::string(const std::vector<int>&)>;

// Every process's share of its own list (`lists[p]`, process p's, on `hosts[p]`; empty
// for a process without GPUs). SameOnEveryProcess, input "gpus", when a list does not
// split among its host's processes or two processes of a host take one GPU.
inline std::vector<std::vector<int>> launch_shares(std::span<const std::string> hosts,
                                                   std::span<const std::vector<int>> lists,
                                                   const ProcessNames& names) {
  std::vector<std::vector<int>> shares;
  for (std::size_t p = 0; p < lists.size(); ++p) {
    const LocalRank r = local_rank(hosts, static_cast<int>(p));
    try {
      shares.push_back(devices_for_local_rank(lists[p], r.index, r.count));
    } catch (const InputError& e) {
      std::vector<int> peers;
      for (std::size_t q = 0; q < hosts.size(); ++q) {
        if (hosts[q] == hosts[p]) peers.push_back(static_cast<int>(q));
      }
      throw SameOnEveryProcess(std::string(e.what()) + " on host " + hosts[p] + " (" + names(peers) +
                                   "): each process of a host takes an equal share of the list, in order",
                               "gpus");
    }
  }
  if (const auto clash = find_clash(hosts, shares)) {
    throw SameOnEveryProcess(names({clash->first, clash->second}) + " both take GPU " +
                                 std::to_string(clash->device) +
                                 ": the processes of a host need the same list (each takes its share) or lists "
                                 "that do not overlap",
                             "gpus");
  }
  return shares;
}

// This process's share of `listed` (its GPUs; empty: it runs on CPUs) under the rule,
// every process's list exchanged within `timeout_s` seconds (0: no limit) and checked as
// launch_shares does. Every process of the launch calls it, at the same point.
std::vector<int> host_share(Processes& processes, std::span<const int> listed, double timeout_s);

}  // namespace mnist_mt
