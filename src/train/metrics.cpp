#include "metrics.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/file_io.hpp"

namespace mnist_mt {
namespace {

// Far above a run's lines (about 400 bytes an epoch): only a bound on a wrong file.
constexpr std::uint64_t kMaxMetricsBytes = std::uint64_t{64} << 20;

}  // namespace

MetricsFile::MetricsFile(const std::filesystem::path& path, bool append, std::uint64_t kept_epochs) : path_(path) {
  struct stat st {};
  if (!append || (::stat(path.c_str(), &st) != 0 && errno == ENOENT)) return;
  const std::vector<std::uint8_t> bytes = read_file_bytes(path, kMaxMetricsBytes);
  const std::string text(bytes.begin(), bytes.end());
  // Line by line; a line cut short stays a line of its own, and one that is not an
  // epoch's record (not JSON, no epoch number) is kept as it is.
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_object() && record.contains("epoch") && record["epoch"].is_number_unsigned() &&
        record["epoch"].get<std::uint64_t>() > kept_epochs)
      continue;
    text_ += line + '\n';
  }
}

void MetricsFile::write(const EpochMetrics& m) {
  // NaN (no evaluation) is written as null.
  const nlohmann::ordered_json line = {
      {"epoch", m.epoch},
      {"train_loss", m.train_loss},
      {"test_loss", m.test_loss},
      {"test_accuracy", m.test_accuracy},
      {"images_per_s", m.images_per_s},
      {"seconds", m.seconds},
      {"steps", m.steps},
      {"skipped_steps", m.skipped_steps},
      {"peak_rss_bytes", m.peak_rss_bytes},
      {"phase_seconds",
       {{"data_wait", m.phase_seconds.data_wait},
        {"forward", m.phase_seconds.forward},
        {"backward", m.phase_seconds.backward},
        {"comm_wait", m.phase_seconds.comm_wait},
        {"optimizer", m.phase_seconds.optimizer},
        {"broadcast", m.phase_seconds.broadcast},
        {"gather", m.phase_seconds.gather},
        {"host_launch", m.phase_seconds.host_launch},
        {"replayed", m.phase_seconds.replayed}}},
      {"eval_seconds", m.eval_seconds},
      {"precision", precision_name(m.bf16_products, m.tf32)},
  };
  nlohmann::ordered_json out = line;
  if (const auto& bytes = m.bytes_sent_per_step) {
    out["fc1_exchange"] = m.fc1_factors ? "factors" : "gradients";
    out["bytes_sent_per_step"] = {{"conv1", (*bytes)[0]}, {"conv2", (*bytes)[1]}, {"fc1", (*bytes)[2]}, {"fc2", (*bytes)[3]}};
  }
  if (m.graph_nodes) out["graph_nodes"] = *m.graph_nodes;
  if (m.planned_input) out["planned_input"] = true;
  if (m.time_to_target_s) {
    out["time_to_target_s"] = *m.time_to_target_s;
    out["target_eval_seconds"] = *m.target_eval_seconds;
    out["target_step"] = *m.target_step;
  }
  text_ += out.dump() + '\n';
  write_file_atomically(path_, {reinterpret_cast<const std::uint8_t*>(text_.data()), text_.size()});
}

}  // namespace mnist_mt
