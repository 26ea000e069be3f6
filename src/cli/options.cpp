#include "options.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <span>
#include <string_view>
#include <utility>

#include "mnist_mt/data_source.hpp"
#include "mnist_mt/download.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/file_io.hpp"
#include "mnist_mt/trainer.hpp"
#include "mnist_mt/local_devices.hpp"
#include "outputs.hpp"

namespace mnist_mt::cli {
namespace {

// "0,2,3": distinct non-negative device numbers.
std::vector<int> parse_gpus(const std::string& list) {
  if (list.empty()) throw InputError("--gpus: empty device list");
  std::vector<int> ids;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    const std::string item = list.substr(begin, end - begin);
    const auto id = whole_number<int>(item);
    if (!id) throw InputError("--gpus: '" + item + "' is not a device number");
    if (*id < 0) throw InputError("--gpus: device " + item + " is negative");
    if (std::find(ids.begin(), ids.end(), *id) != ids.end()) {
      throw InputError("--gpus: device " + item + " is listed twice");
    }
    ids.push_back(*id);
    begin = end + 1;
  }
  return ids;
}

// bf16 products run on CPU devices only, TF32 on GPUs only.
constexpr const char* kBf16OnCpus = "--precision: bf16 runs on CPU devices only; use --cpu N";
// TF32 asked for, by --precision tf32 or --tf32, on CPU devices.
InputError tf32_on_cpus(const DeviceFlags& f) {
  if (f.precision == "tf32")
    return InputError(
        "--precision: tf32 runs on GPUs only (a tensor-core format; CPU devices have none); use fp32, or --gpus LIST");
  return InputError("--tf32: TF32 runs on GPUs only (a tensor-core format; CPU devices have none); leave it out, or "
                    "--gpus LIST");
}

// CPU devices refuse TF32 (options.tf32), naming the flag that asked for it.
Devices default_devices(const BackendOptions& options, const DeviceFlags& f) {
  Devices d;
  if (cuda_built()) {
    BackendOptions fp32 = options;  // bf16 is refused below, not taken for a missing GPU
    fp32.precision = Precision::kFp32;
    try {
      d.backend = make_cuda_backend(fp32);
      for (int i = 0; i < d.backend->device_count(); ++i) d.ids.push_back(i);
    } catch (const std::exception&) {  // no driver or no device: run on the CPU
    }
    if (!d.ids.empty()) {
      if (options.precision != Precision::kFp32) throw InputError(kBf16OnCpus);
      return d;
    }
  }
  if (options.tf32) throw tf32_on_cpus(f);
  d.backend = with_flag_names({{"precision", "--precision"}}, [&] { return make_cpu_backend(options); });
  for (int i = 0; i < d.backend->device_count(); ++i) d.ids.push_back(i);
  return d;
}

}  // namespace



Devices pick_devices(const DeviceFlags& f, bool pin_cpu_threads) {
  BackendOptions options;
  options.deterministic = f.deterministic;
  options.tf32 = f.tf32 || f.precision == "tf32";
  options.precision = f.precision == "bf16" ? Precision::kBf16 : Precision::kFp32;
  if (f.tf32 && options.precision == Precision::kBf16)
    throw InputError("--tf32: TF32 is a GPU format and --precision bf16 runs on CPU devices: give one of them");
  options.cuda_graphs = !f.no_cuda_graphs;
  options.device_data = !f.no_device_data;
  options.pin_cpu_threads = pin_cpu_threads;
  if (f.gpus && options.precision != Precision::kFp32) throw InputError(kBf16OnCpus);
  if (f.gpus) {
    Devices d{with_flag_names({{"backend", "--gpus"}}, [&] { return make_cuda_backend(options); }),
              parse_gpus(*f.gpus)};
    for (int id : d.ids) {
      if (id >= d.backend->device_count()) {
        throw InputError("--gpus: no device " + std::to_string(id) + " (this machine has " +
                         std::to_string(d.backend->device_count()) + " CUDA devices)");
      }
    }
    return d;
  }
  if (f.cpu) {
    if (options.tf32) throw tf32_on_cpus(f);
    const std::uint32_t count = count_flag(*f.cpu, 1, "--cpu");
    Devices d{with_flag_names({{"precision", "--precision"}}, [&] { return make_cpu_backend(options); }), {}};
    for (std::uint32_t i = 0; i < count; ++i) d.ids.push_back(static_cast<int>(i));
    return d;
  }
  return default_devices(options, f);
}

void take_host_share(Devices& d, const DeviceFlags& f, Processes& processes, double timeout_s) {
  const bool gpus = d.backend->name() != "cpu";
  try {
    std::vector<int> share = host_share(processes, gpus ? std::span<const int>(d.ids) : std::span<const int>(), timeout_s);
    if (gpus) d.ids = std::move(share);
  } catch (const SameOnEveryProcess& e) {
    throw SameOnEveryProcess(std::string(f.gpus ? "--gpus" : "every GPU of each host (no --gpus)") + ": " + e.what());
  }
}

Checkpoint load_flag(const std::filesystem::path& path) {
  try {
    return load_checkpoint(path);
  } catch (const InputError& e) {
    throw InputError(std::string("--load: ") + e.what());
  }
}

DatasetKind dataset_kind(const DataFlags& f) {
  return f.dataset == "fashion-mnist" ? DatasetKind::kFashionMnist : DatasetKind::kMnist;
}

DataChoice find_data(const DataFlags& f) {
  const DatasetKind kind = dataset_kind(f);
  if (f.download) {
    const std::filesystem::path root = cache_root();
    if (!f.data && root.empty()) throw InputError("--download: no --data, and neither XDG_CACHE_HOME nor HOME is set");
    return {f.data ? std::filesystem::path(*f.data) : download_dir(root, kind), std::string(dataset_name(kind)), ""};
  }
  DataQuery query;
  query.wanted = kind;
  if (f.data) query.data_dir = *f.data;
  query.env_dir = env_path("MNIST_MT_DATA");
  query.cache_root = cache_root();
  // A data set named is that one or none: no fallback, and a directory that holds the
  // other one would train on it under the name asked for.
  query.fashion_fallback = !f.dataset;
  DataChoice choice = locate_data(query);
  const std::string_view asked = dataset_name(kind);
  if (f.dataset && choice.name != asked && choice.name != "IDX files")
    throw InputError("--dataset " + *f.dataset + ": " + choice.dir.string() + " holds " + choice.name + ", not " +
                     std::string(asked));
  return choice;
}

Dataset load_data(const DataFlags& f, std::ostream& out, const StopRequest* stop, std::string* name) {
  if (!f.mirrors.empty() && !f.download) throw InputError("--mirror: only with --download");
  const DataChoice choice = find_data(f);
  out << "mnist_mt: " << choice.name << " from " << one_line(choice.dir.string()) << (f.download ? " (--download)" : "")
      << std::endl;
  if (!choice.notice.empty()) std::cerr << "mnist_mt: " << one_line(choice.notice) << std::endl;
  if (f.download) {
    DownloadRequest request{dataset_kind(f), choice.dir, f.mirrors, &out, isatty(STDERR_FILENO) != 0};
    if (stop != nullptr) request.stop_signal = [stop] { return stop->stop_signal(); };
    download_dataset(request);
  }
  if (name != nullptr) *name = choice.name;
  return load_dataset(choice.dir);
}



namespace {

// The first number of a line of `file` that begins with `key` (/proc/meminfo's
// "MemAvailable:"), or of its only line when `key` is empty (a cgroup's memory.max).
std::optional<std::uint64_t> number_in(const char* file, std::string_view key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(key)) continue;
    const std::string_view rest = std::string_view(line).substr(key.size());
    const std::size_t at = rest.find_first_not_of(' ');
    if (at == std::string_view::npos) return std::nullopt;
    return whole_number<std::uint64_t>(rest.substr(at, rest.find(' ', at) - at));
  }
  return std::nullopt;
}

// The bytes this process may still take, and where that figure comes from.
std::optional<std::pair<std::uint64_t, std::string>> memory_available() {
  if (const char* given = std::getenv("MNIST_MT_MEMORY_AVAILABLE")) {
    const auto bytes = whole_number<std::uint64_t>(given);
    if (!bytes) throw InputError(std::string("MNIST_MT_MEMORY_AVAILABLE: expected bytes as a whole number, got '") +
                                 given + "'");
    return std::pair{*bytes, std::string("MNIST_MT_MEMORY_AVAILABLE")};
  }
  std::optional<std::pair<std::uint64_t, std::string>> best;
  if (const auto kb = number_in("/proc/meminfo", "MemAvailable:")) best = {*kb * 1024, "MemAvailable"};
  const auto limit = number_in("/sys/fs/cgroup/memory.max", ""), used = number_in("/sys/fs/cgroup/memory.current", "");
  if (limit && used) {
    const std::uint64_t left = *limit > *used ? *limit - *used : 0;
    if (!best || left < best->first) best = {left, "the cgroup's memory.max"};
  }
  return best;
}

std::string gib(std::uint64_t bytes) {
  char text[32];
  const bool large = bytes >= (1u << 30);
  std::snprintf(text, sizeof text, large ? "%.1f GiB" : "%.1f MiB",
                static_cast<double>(bytes) / (large ? (1u << 30) : (1u << 20)));
  return text;
}

}  // namespace

void check_host_memory(const Backend& backend, std::uint64_t batch, std::size_t ranks) {
  const std::uint64_t per_sample = backend.host_bytes_per_sample();
  if (per_sample == 0) return;
  const auto available = memory_available();
  if (!available) return;
  const std::uint64_t need = per_sample * batch * ranks;
  if (need <= available->first) return;
  throw InputError("--batch-size: " + std::to_string(batch) + " images a rank on " + std::to_string(ranks) +
                   (ranks == 1 ? " rank" : " ranks") + " need " + gib(need) +
                   " of memory for their activations alone, more than the " + gib(available->first) +
                   " available (" + available->second + "); use a smaller --batch-size");
}

std::uint32_t count_flag(std::int64_t value, std::int64_t min, const std::string& flag) {
  constexpr std::int64_t kMax = std::numeric_limits<std::uint32_t>::max();
  if (value < min || value > kMax) {
    throw InputError(flag + ": must be from " + std::to_string(min) + " to " + std::to_string(kMax) + ", got " +
                     std::to_string(value));
  }
  return static_cast<std::uint32_t>(value);
}

void throw_naming_flag(const InputError& error, const FlagNames& flags) {
  const auto flag = flags.find(error.input());
  if (flag == flags.end()) throw;  // as it is, of its own type
  throw InputError(flag->second + ": " + error.what());
}

}  // namespace mnist_mt::cli
