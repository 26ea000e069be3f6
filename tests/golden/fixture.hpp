#pragma once
// Reads the fixtures that gen_golden.py writes (safetensors of any dtype), for tests only.
// Deliberately separate from src/model/checkpoint.cpp, so the two readers check each other.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace mnist_mt::testing {

// tests/golden in the source tree: MNIST_MT_SOURCE_ROOT (set by tests/meson.build), or the
// source path this header was compiled from.
inline std::filesystem::path golden_dir() {
  if (const char* root = std::getenv("MNIST_MT_SOURCE_ROOT")) return std::filesystem::path(root) / "tests" / "golden";
  return std::filesystem::path(__FILE__).parent_path();
}

struct FixtureTensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<char> bytes;

  template <class T>
  std::vector<T> as() const {
    static const std::map<std::string, std::size_t> kSizes{{"F32", 4}, {"F64", 8}, {"U8", 1}, {"U32", 4}, {"U64", 8}};
    if (kSizes.at(dtype) != sizeof(T)) throw std::runtime_error("fixture dtype " + dtype + " read with the wrong type");
    std::vector<T> out(bytes.size() / sizeof(T));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
};

class Fixture {
 public:
  explicit Fixture(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(path.string() + ": cannot open");
    const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, file.data(), 8);
    const auto header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(header_bytes));
    const char* data = file.data() + 8 + header_bytes;
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        metadata_ = entry.get<std::map<std::string, std::string>>();
        continue;
      }
      const auto begin = entry["data_offsets"][0].get<std::size_t>(), end = entry["data_offsets"][1].get<std::size_t>();
      tensors_[name] = {entry["dtype"].get<std::string>(), entry["shape"].get<std::vector<std::int64_t>>(),
                        std::vector<char>(data + begin, data + end)};
    }
  }

  const FixtureTensor& tensor(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end()) throw std::runtime_error("fixture has no tensor " + name);
    return it->second;
  }
  template <class T>
  std::vector<T> get(const std::string& name) const {
    return tensor(name).as<T>();
  }
  const std::string& meta(const std::string& key) const { return metadata_.at(key); }

 private:
  std::map<std::string, FixtureTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// golden.safetensors, read once per test binary.
inline const Fixture& golden() {
  static const Fixture fixture(golden_dir() / "golden.safetensors");
  return fixture;
}

}  // namespace mnist_mt::testing
