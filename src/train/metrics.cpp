#include "metrics.hpp"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "mnist_mt/error.hpp"

namespace mnist_mt {

MetricsFile::MetricsFile(const std::filesystem::path& path) : path_(path), out_(path, std::ios::trunc) {
  if (!out_) throw InputError("metrics file " + path.string() + ": cannot write: " + std::strerror(errno), "metrics");
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
        {"host_launch", m.phase_seconds.host_launch}}},
  };
  out_ << line.dump() << '\n' << std::flush;
  if (!out_) throw RuntimeFailure("metrics file " + path_.string() + ": writing failed");
}

}  // namespace mnist_mt
