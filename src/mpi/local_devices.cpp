// The exchange behind the local-rank rule (local_devices.hpp): every process's list,
// padded to the longest, so that each process judges every share alike.
#include "mnist_mt/local_devices.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "mnist_mt/processes.hpp"

namespace mnist_mt {

std::vector<int> host_share(Processes& processes, std::span<const int> listed, double timeout_s) {
  const auto count = static_cast<std::size_t>(processes.count());
  const std::string when = "while the processes chose their GPUs";
  const auto mine = static_cast<std::int32_t>(listed.size());
  std::vector<std::int32_t> sizes(count);
  allgather_within(processes, &mine, sizes.data(), sizeof mine, timeout_s, when);
  const auto longest = static_cast<std::size_t>(*std::max_element(sizes.begin(), sizes.end()));
  std::vector<std::vector<int>> lists(count);
  if (longest > 0) {  // every process knows it: all skip the second exchange or none
    std::vector<std::int32_t> padded(longest, -1);
    std::copy(listed.begin(), listed.end(), padded.begin());
    std::vector<std::int32_t> all(longest * count);
    allgather_within(processes, padded.data(), all.data(), longest * sizeof(std::int32_t), timeout_s, when);
    for (std::size_t p = 0; p < count; ++p) {
      const auto first = all.begin() + static_cast<std::ptrdiff_t>(longest * p);
      lists[p].assign(first, first + sizes[p]);
    }
  }
  std::vector<std::string> hosts;
  for (std::size_t p = 0; p < count; ++p) hosts.push_back(processes.host(static_cast<int>(p)));
  const auto names = [&](const std::vector<int>& which) { return process_names(processes, which); };
  return launch_shares(hosts, lists, names)[static_cast<std::size_t>(processes.index())];
}

}  // namespace mnist_mt
