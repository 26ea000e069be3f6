// safetensors checkpoints: 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw little-endian data.
#include "mnist_mt/checkpoint.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "mnist_mt/file_io.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

// Version 1 held SGD's buffer as "momentum.<name>" and no optimizer: still read.
constexpr std::string_view kFormatVersion = "2";
constexpr std::string_view kOldMomentumPrefix = "momentum.";
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;  // safetensors' own limit
// Far above a checkpoint's 9.6 MB: only a bound on what a wrong path makes us read.
constexpr std::uint64_t kMaxFileBytes = std::uint64_t{1} << 30;

using Json = nlohmann::ordered_json;

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& problem) {
  throw InputError(path.string() + ": " + problem);
}

// One tensor of the file: a parameter, or its part of an optimizer state buffer.
struct Slot {
  std::string name;
  const ParamInfo* param;
  int buffer;  // -1: the parameter; 0, 1: OptimizerState::first, second
};

// `prefixes`: the state buffers' names, "momentum_buffer." and so on.
std::vector<Slot> slots(const std::vector<std::string>& prefixes) {
  std::vector<Slot> out;
  for (const ParamInfo& p : kParams) out.push_back({std::string(p.name), &p, -1});
  for (std::size_t b = 0; b < prefixes.size(); ++b)
    for (const ParamInfo& p : kParams) out.push_back({prefixes[b] + std::string(p.name), &p, static_cast<int>(b)});
  return out;
}

std::vector<std::string> state_prefixes(OptimizerKind kind) {
  std::vector<std::string> out;
  for (int b = 0; b < state_buffers(kind); ++b) out.push_back(std::string(state_name(kind, b)) + ".");
  return out;
}

std::vector<float>& buffer_of(Checkpoint& c, int buffer) {
  return buffer < 0 ? c.params : buffer == 0 ? c.state.first : c.state.second;
}
const std::vector<float>& buffer_of(const Checkpoint& c, int buffer) {
  return buffer_of(const_cast<Checkpoint&>(c), buffer);
}

bool has_state(const Checkpoint& c) { return !c.state.first.empty(); }

Json shape_json(const ParamInfo& p) {
  Json shape = Json::array();
  for (int d = 0; d < p.dims; ++d) shape.push_back(p.shape[d]);
  return shape;
}

std::string header_text(const Checkpoint& c) {
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"},
                            {"format_version", std::string(kFormatVersion)},
                            {"epoch", std::to_string(c.epoch)},
                            {"step", std::to_string(c.step)},
                            {"epoch_step", std::to_string(c.epoch_step)},
                            {"seed", std::to_string(c.seed)}};
  if (c.world != 0) {
    header["__metadata__"]["world"] = std::to_string(c.world);
    header["__metadata__"]["batch"] = std::to_string(c.batch);
  }
  if (c.shard_order) header["__metadata__"]["sum_order"] = "shards";
  if (c.fc1_factors) header["__metadata__"]["fc1_exchange"] = "factors";
  if (c.bf16_products) header["__metadata__"]["products"] = "bf16";
  header["__metadata__"]["optimizer"] = std::string(optimizer_name(c.optimizer));
  if (c.test_accuracy) header["__metadata__"]["test_accuracy"] = exact_text(*c.test_accuracy);
  if (!c.dataset.empty()) header["__metadata__"]["dataset"] = c.dataset;
  for (const auto& [flag, value] : c.settings) {
    if (!flag.starts_with("--") || header["__metadata__"].contains(flag))
      throw RuntimeFailure("save_checkpoint: setting '" + flag + "' is no flag, or given twice");
    header["__metadata__"][flag] = value;
  }
  if (has_state(c)) header["__metadata__"]["optimizer_step"] = std::to_string(c.state.applied);
  std::uint64_t offset = 0;
  for (const Slot& s : slots(has_state(c) ? state_prefixes(c.optimizer) : std::vector<std::string>{})) {
    const std::uint64_t bytes = s.param->count * sizeof(float);
    header[s.name] = {{"dtype", "F32"}, {"shape", shape_json(*s.param)}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // keeps the data 8-byte aligned
  return text;
}

std::string shape_text(const Json& shape) { return shape.dump(); }

// Byte range of one tensor within the data section.
struct Extent {
  std::uint64_t begin, end;
  const std::string* name;
};

Extent check_tensor(const std::filesystem::path& path, const std::string& name, const Json& entry,
                    const ParamInfo& param, std::uint64_t data_bytes) {
  if (!entry.is_object()) fail(path, "tensor '" + name + "' is not a JSON object");
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) fail(path, "tensor '" + name + "' has no dtype");
  if (*dtype != "F32") fail(path, "tensor '" + name + "' has dtype " + dtype->get<std::string>() + ", expected F32");
  const auto shape = entry.find("shape");
  const bool shape_ok = shape != entry.end() && shape->is_array() &&
                        std::all_of(shape->begin(), shape->end(), [](const Json& d) { return d.is_number_unsigned(); }) &&
                        *shape == shape_json(param);
  if (!shape_ok)
    fail(path, "tensor '" + name + "' has shape " + (shape == entry.end() ? "(none)" : shape_text(*shape)) +
                   ", expected " + shape_text(shape_json(param)));
  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    fail(path, "tensor '" + name + "' has no valid data_offsets");
  const auto begin = (*offsets)[0].get<std::uint64_t>(), end = (*offsets)[1].get<std::uint64_t>();
  if (begin > end || end > data_bytes)
    fail(path, "tensor '" + name + "' has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] outside the " + std::to_string(data_bytes) + "-byte data section");
  if (end - begin != param.count * sizeof(float))
    fail(path, "tensor '" + name + "' has " + std::to_string(end - begin) + " bytes, expected " +
                   std::to_string(param.count * sizeof(float)));
  return {begin, end, &name};
}

// One past the '}' that closes the JSON object `text` starts with (npos: none), so that
// what follows it can be told from the JSON. Brackets are counted outside strings.
std::size_t object_end(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// The header as strictly as safetensors defines it: a JSON object from its first byte,
// padded with spaces only, and no key twice in an object (parsers differ on which of
// the two they keep).
Json parse_header(const std::filesystem::path& path, std::string_view text) {
  if (text.empty() || text.front() != '{') fail(path, "header is not a JSON object (it must start with '{')");
  const std::size_t end = std::min(object_end(text), text.size());
  std::vector<std::set<std::string>> keys;  // of each object open while parsing
  std::string repeated;
  const Json::parser_callback_t check_keys = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second && repeated.empty())
      repeated = parsed.get<std::string>();
    return true;
  };
  Json header;
  try {
    header = Json::parse(text.begin(), text.begin() + end, check_keys);
  } catch (const Json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (const std::size_t bad = text.find_first_not_of(' ', end); bad != std::string_view::npos)
    fail(path, "header has bytes after its JSON other than space padding (from byte " + std::to_string(bad) +
                   " of the header)");
  if (!repeated.empty()) fail(path, "header has the key '" + repeated + "' twice in one object");
  return header;
}

template <class T>
T metadata_number(const std::filesystem::path& path, const Json& metadata, const char* key) {
  const auto it = metadata.find(key);
  if (it == metadata.end()) fail(path, std::string("metadata has no '") + key + "'");
  const auto& text = it->get_ref<const std::string&>();
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size())
    fail(path, std::string("metadata '") + key + "' is not an unsigned integer: '" + text + "'");
  return value;
}

}  // namespace

std::string exact_text(double value) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value == 0 ? 0.0 : value);
  return std::string(text, ec == std::errc() ? end : text);
}

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint) {
  const int buffers = has_state(checkpoint) ? state_buffers(checkpoint.optimizer) : 0;
  bool sizes_ok = checkpoint.params.size() == kParamCount;
  for (int b = 0; b < 2; ++b) sizes_ok = sizes_ok && buffer_of(checkpoint, b).size() == (b < buffers ? kParamCount : 0);
  if (!sizes_ok)
    throw RuntimeFailure("save_checkpoint: the parameters and each of the " + std::string(optimizer_name(checkpoint.optimizer)) +
                         " optimizer's state buffers must hold " + std::to_string(kParamCount) + " floats");
  const std::string header = header_text(checkpoint);
  const std::uint64_t header_bytes = header.size();
  AtomicFile file(path);
  file.write(&header_bytes, sizeof header_bytes);
  file.write(header.data(), header.size());
  for (int b = -1; b < buffers; ++b) file.write(buffer_of(checkpoint, b).data(), kParamCount * sizeof(float));
  file.commit();
}

Checkpoint load_checkpoint(const std::filesystem::path& path) {
  const std::vector<std::uint8_t> bytes = read_file_bytes(path, kMaxFileBytes);
  if (bytes.size() < 8) fail(path, "truncated: " + std::to_string(bytes.size()) + " bytes, no header length");
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  if (header_bytes > kMaxHeaderBytes) fail(path, "header length " + std::to_string(header_bytes) + " exceeds 100 MiB");
  if (header_bytes > bytes.size() - 8)
    fail(path, "truncated: header of " + std::to_string(header_bytes) + " bytes declared, " +
                   std::to_string(bytes.size() - 8) + " present");
  const char* data = reinterpret_cast<const char*>(bytes.data()) + 8 + header_bytes;
  const std::uint64_t data_bytes = bytes.size() - 8 - header_bytes;

  const Json header = parse_header(path, {reinterpret_cast<const char*>(bytes.data()) + 8, header_bytes});

  const auto metadata = header.find("__metadata__");
  if (metadata == header.end()) fail(path, "no __metadata__ (format_version, epoch, step, seed)");
  if (!metadata->is_object() ||
      !std::all_of(metadata->begin(), metadata->end(), [](const Json& v) { return v.is_string(); }))
    fail(path, "__metadata__ is not a map of strings");
  const auto version = metadata->find("format_version");
  const bool version_1 = version != metadata->end() && *version == "1";
  if (version == metadata->end() || (*version != kFormatVersion && !version_1))
    fail(path, "unsupported format_version " + (version == metadata->end() ? "(none)" : version->dump()) +
                   ", expected \"" + std::string(kFormatVersion) + "\" or \"1\"");

  Checkpoint checkpoint;
  if (const auto name = metadata->find("optimizer"); name != metadata->end()) {
    const std::optional<OptimizerKind> kind = parse_optimizer(name->get<std::string>());
    if (!kind) fail(path, "metadata 'optimizer' is " + name->dump() + ", not sgd, adam, adamw or adadelta");
    checkpoint.optimizer = *kind;
  }
  const std::vector<std::string> prefixes =
      version_1 ? std::vector<std::string>{std::string(kOldMomentumPrefix)} : state_prefixes(checkpoint.optimizer);
  // The state is all of the optimizer's buffers or none: a file of parameters only.
  const bool with_state = std::any_of(header.items().begin(), header.items().end(), [&](const auto& item) {
    return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return item.key().starts_with(p); });
  });
  const std::vector<Slot> expected = slots(with_state ? prefixes : std::vector<std::string>{});
  for (const auto& item : header.items()) {
    const std::string& name = item.key();  // not a structured binding: lambdas capture it
    if (name != "__metadata__" &&
        std::none_of(expected.begin(), expected.end(), [&](const Slot& s) { return s.name == name; }))
      fail(path, "unexpected tensor '" + name + "'");
  }

  std::vector<Extent> extents;
  for (const Slot& s : expected) {
    const auto entry = header.find(s.name);
    if (entry == header.end()) fail(path, "missing tensor '" + s.name + "'");
    extents.push_back(check_tensor(path, s.name, *entry, *s.param, data_bytes));
  }
  // The tensors must tile the data section exactly: no overlap, no gap, nothing after.
  std::vector<Extent> sorted = extents;
  std::sort(sorted.begin(), sorted.end(), [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i].begin < covered) fail(path, "tensors '" + *sorted[i - 1].name + "' and '" + *sorted[i].name + "' overlap");
    if (sorted[i].begin > covered)
      fail(path, "bytes [" + std::to_string(covered) + ", " + std::to_string(sorted[i].begin) +
                     ") of the data section belong to no tensor");
    covered = sorted[i].end;
  }
  if (covered != data_bytes)
    fail(path, "data section has " + std::to_string(data_bytes) + " bytes, the tensors cover " + std::to_string(covered));

  checkpoint.epoch = metadata_number<std::uint32_t>(path, *metadata, "epoch");
  checkpoint.step = metadata_number<std::uint64_t>(path, *metadata, "step");
  checkpoint.seed = metadata_number<std::uint64_t>(path, *metadata, "seed");
  // Files from before mid-epoch checkpoints hold epoch ends only.
  if (metadata->contains("epoch_step"))
    checkpoint.epoch_step = metadata_number<std::uint32_t>(path, *metadata, "epoch_step");
  // Nor the layout, in files from before it was recorded.
  if (metadata->contains("world") || metadata->contains("batch")) {
    checkpoint.world = metadata_number<std::uint32_t>(path, *metadata, "world");
    checkpoint.batch = metadata_number<std::uint32_t>(path, *metadata, "batch");
    if (checkpoint.world == 0 || checkpoint.batch == 0)
      fail(path, "metadata 'world' " + std::to_string(checkpoint.world) + " and 'batch' " +
                     std::to_string(checkpoint.batch) + " must be positive");
  }
  if (const auto order = metadata->find("sum_order"); order != metadata->end()) {
    if (*order != "shards") fail(path, "metadata 'sum_order' is " + order->dump() + ", not \"shards\"");
    checkpoint.shard_order = true;
  }
  if (const auto exchange = metadata->find("fc1_exchange"); exchange != metadata->end()) {
    if (*exchange != "factors" && *exchange != "gradients")
      fail(path, "metadata 'fc1_exchange' is " + exchange->dump() + ", not \"factors\" or \"gradients\"");
    checkpoint.fc1_factors = *exchange == "factors";
  }
  if (const auto products = metadata->find("products"); products != metadata->end()) {
    if (*products != "bf16" && *products != "fp32")
      fail(path, "metadata 'products' is " + products->dump() + ", not \"bf16\" or \"fp32\"");
    checkpoint.bf16_products = *products == "bf16";
  }
  if (const auto accuracy = metadata->find("test_accuracy"); accuracy != metadata->end()) {
    const std::string& text = accuracy->get_ref<const std::string&>();
    double value = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || !(value >= 0 && value <= 1))
      fail(path, "metadata 'test_accuracy' is " + accuracy->dump() + ", not a fraction from 0 to 1");
    checkpoint.test_accuracy = value;
  }
  // A setting's value is a flag's, and the data set a name: short, printable text (a
  // resumed run quotes them).
  const auto quoted = [&](const std::string& key, const std::string& value) {
    if (value.empty() || value.size() > 64 ||
        !std::all_of(value.begin(), value.end(), [](char c) { return c >= 0x20 && c < 0x7f; }))
      fail(path, "metadata '" + key + "' is not a setting's value (1 to 64 printable characters)");
    return value;
  };
  for (const auto& item : metadata->items()) {
    if (item.key().starts_with("--"))
      checkpoint.settings.emplace_back(item.key(), quoted(item.key(), item.value().get_ref<const std::string&>()));
  }
  if (const auto dataset = metadata->find("dataset"); dataset != metadata->end())
    checkpoint.dataset = quoted("dataset", dataset->get_ref<const std::string&>());
  if (with_state) {
    // Version 1 kept no count: its SGD buffer had started once a step was taken.
    checkpoint.state.applied = version_1 ? checkpoint.step
                                         : metadata_number<std::uint64_t>(path, *metadata, "optimizer_step");
  }
  checkpoint.params.resize(kParamCount);
  for (int b = 0; b < (with_state ? state_buffers(checkpoint.optimizer) : 0); ++b)
    buffer_of(checkpoint, b).resize(kParamCount);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    float* out = buffer_of(checkpoint, expected[i].buffer).data() + expected[i].param->offset;
    std::memcpy(out, data + extents[i].begin, extents[i].end - extents[i].begin);
  }
  // A model that diverged must not be trained on as if it had not.
  for (const Slot& s : expected) {
    const float* v = buffer_of(checkpoint, s.buffer).data() + s.param->offset;
    const auto bad = std::find_if(v, v + s.param->count, [](float x) { return !std::isfinite(x); });
    if (bad != v + s.param->count)
      fail(path, "tensor '" + s.name + "' holds a non-finite value at element " + std::to_string(bad - v));
  }
  return checkpoint;
}

}  // namespace mnist_mt
