#include "algo_cache.hpp"

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <vector>

#include "mnist_mt/error.hpp"
#include "mnist_mt/file_io.hpp"

namespace mnist_mt::cuda {
namespace {

constexpr const char* kFormat = "# mnist_mt cuDNN algorithm choices, format ";
constexpr const char* kHeader = "# mnist_mt cuDNN algorithm choices, format 1";
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 20;

// "KEY\tf fm b bm d dm" per line after the header; nullopt for anything else.
std::optional<std::map<std::string, ConvChoice>> parse(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kHeader) return std::nullopt;
  std::map<std::string, ConvChoice> out;
  while (std::getline(in, line)) {
    const std::size_t tab = line.find('\t');
    if (tab == 0 || tab == std::string::npos) return std::nullopt;
    std::istringstream values(line.substr(tab + 1));
    ConvChoice c;
    if (!(values >> c.forward >> c.forward_math >> c.filter >> c.filter_math >> c.data >> c.data_math)) return std::nullopt;
    std::string rest;
    if (values >> rest) return std::nullopt;
    out[line.substr(0, tab)] = c;
  }
  return out;
}

std::string format(const std::map<std::string, ConvChoice>& entries) {
  std::ostringstream out;
  out << kHeader << '\n';
  for (const auto& [key, c] : entries)
    out << key << '\t' << c.forward << ' ' << c.forward_math << ' ' << c.filter << ' ' << c.filter_math << ' '
        << c.data << ' ' << c.data_math << '\n';
  return out.str();
}

}  // namespace

AlgoCache::AlgoCache(std::filesystem::path file) : file_(std::move(file)) {}

std::filesystem::path AlgoCache::default_file() {
  constexpr const char* kFile = "cudnn-algorithms.txt";
  if (const char* own = std::getenv("MNIST_MT_CACHE_DIR"))  // set and empty: no file
    return *own == '\0' ? std::filesystem::path() : std::filesystem::path(own) / kFile;
  if (const std::filesystem::path root = cache_root(); !root.empty()) return root / kFile;
  return {};
}

AlgoCache& AlgoCache::shared() {
  static AlgoCache cache(default_file());
  return cache;
}

void AlgoCache::warn(const std::string& what) {
  if (warned_) return;
  warned_ = true;
  std::cerr << "mnist_mt: warning: cuDNN algorithm cache " << what << "\n";
}

std::map<std::string, ConvChoice> AlgoCache::read_file() {
  std::error_code ec;
  if (file_.empty() || !std::filesystem::exists(file_, ec)) return {};
  try {
    const std::vector<std::uint8_t> bytes = read_file_bytes(file_, kMaxBytes);
    const std::string text(bytes.begin(), bytes.end());
    if (auto entries = parse(text)) return *entries;
    if (text.rfind(kFormat, 0) == 0 && text.rfind(kHeader, 0) != 0) {  // another version's format
      foreign_ = true;
      warn(file_.string() + ": another version's format: left alone (choices are kept for this run only)");
      return {};
    }
    warn(file_.string() + ": not a file of this version's choices: ignored (it is replaced at the next choice)");
  } catch (const std::exception& e) {
    warn(std::string(e.what()) + ": ignored");
  }
  return {};
}

std::optional<ConvChoice> AlgoCache::find(const std::string& key) {
  std::lock_guard lock(mutex_);
  if (!loaded_) {
    entries_ = read_file();
    loaded_ = true;
  }
  const auto at = entries_.find(key);
  if (at == entries_.end()) return std::nullopt;
  return at->second;
}

void AlgoCache::store(const std::string& key, const ConvChoice& choice) {
  if (key.empty() || key.find_first_of("\t\n") != std::string::npos)
    throw RuntimeFailure("a cuDNN algorithm cache key may not be empty nor hold a tab or newline: '" + key + "'");
  std::lock_guard lock(mutex_);
  loaded_ = true;
  std::map<std::string, ConvChoice> merged = read_file();  // other processes' choices since
  for (const auto& [k, c] : entries_) merged.emplace(k, c);
  merged[key] = choice;
  entries_ = merged;
  if (file_.empty() || foreign_) return;
  try {
    std::filesystem::create_directories(file_.parent_path());
    const std::string text = format(entries_);
    write_file_atomically(file_, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
  } catch (const std::exception& e) {
    warn(std::string("not written: ") + e.what() + " (choices are kept for this run only)");
  }
}

}  // namespace mnist_mt::cuda
