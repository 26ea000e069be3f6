#pragma once
// What every subcommand shares: the device flags, the data flags, and the checks that
// turn a flag's value into a config value (an error names the flag), and the naming of
// the library's errors about values by their flags.
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/data_source.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/processes.hpp"

namespace CLI {
class App;
}

namespace mnist_mt {
class StopRequest;
}

namespace mnist_mt::cli {

struct DeviceFlags {
  std::optional<std::int64_t> cpu;
  std::optional<std::string> gpus;
  bool deterministic = false;
  bool tf32 = false;
  std::string precision = "fp32";
  bool no_cuda_graphs = false;  // train's flag
  bool no_device_data = false;  // train's flag
  bool no_pin = false;          // train's flag
};

struct DataFlags {
  std::optional<std::string> data;
  std::optional<std::string> dataset;  // --dataset; none: MNIST
  bool download = false;
  std::vector<std::string> mirrors;
};

// The flags as CLI11 options; these and every command's are declared in flags.cpp.
void add_device_flags(CLI::App& app, DeviceFlags& f);
void add_data_flags(CLI::App& app, DataFlags& f);

struct Devices {
  std::unique_ptr<Backend> backend;
  std::vector<int> ids;
};
// The backend and devices the flags name; no flag: every GPU, else a CPU rank per CPU
// the process may use. `pin_cpu_threads`: BackendOptions' (train's, unless --no-pin).
Devices pick_devices(const DeviceFlags& f, bool pin_cpu_threads = false);
// Under a launcher: the processes that share a host split their GPU lists by local rank
// (mnist_mt/local_devices.hpp), every process's list exchanged within `timeout_s`; CPU
// devices stay as they are. Every process calls it; its errors name --gpus.
void take_host_share(Devices& d, const DeviceFlags& f, Processes& processes, double timeout_s);

// The checkpoint --load names; its errors name --load. Each command reads it before the
// data is found or downloaded, so that a bad file is refused first.
Checkpoint load_flag(const std::filesystem::path& path);

// The data set the flags name.
DatasetKind dataset_kind(const DataFlags& f);
// Where the data flags lead (DESIGN of the search: data_source.hpp); with --download,
// the directory the files go to. InputError when they lead nowhere.
DataChoice find_data(const DataFlags& f);

// Downloads when asked, finds the data (find_data), prints the line naming the data set
// and its directory on `out` and any notice on stderr. A `stop` request abandons a
// download at once (Interrupted), leaving no partial file.
// `name`, when given, receives the data set's name as the data line says it ("MNIST",
// "Fashion-MNIST", "IDX files", ...).
Dataset load_data(const DataFlags& f, std::ostream& out, const StopRequest* stop = nullptr, std::string* name = nullptr);

// The whole of `text` as a number, or nothing.
template <typename T>
std::optional<T> whole_number(std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// A count from min up to what 32 bits hold.
std::uint32_t count_flag(std::int64_t value, std::int64_t min, const std::string& flag);

// Refuses (InputError naming --batch-size) a batch whose activation buffers alone, on
// `ranks` ranks of this process, need more host memory than it may use: MemAvailable,
// less where a cgroup limits it, or MNIST_MT_MEMORY_AVAILABLE (bytes) when set. Nothing
// for a backend whose buffers are not in host memory, or when neither is known.
void check_host_memory(const Backend& backend, std::uint64_t batch, std::size_t ranks);

// Config member (InputError::input()) -> the flag that gives it.
using FlagNames = std::map<std::string, std::string, std::less<>>;

// The library names a bad value; the user needs the flag: an InputError whose input()
// has a flag in `flags` is thrown again as "FLAG: message". Others pass unchanged (it is
// called inside the handler, and rethrows them as they are).
[[noreturn]] void throw_naming_flag(const InputError& error, const FlagNames& flags);

template <typename F>
decltype(auto) with_flag_names(const FlagNames& flags, F&& f) {
  try {
    return f();
  } catch (const InputError& e) {
    throw_naming_flag(e, flags);
  }
}

}  // namespace mnist_mt::cli
