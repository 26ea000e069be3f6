#pragma once
// --download: fetches a data set's four .gz files through libcurl from its mirrors,
// each verified against the published checksums before it is renamed into place.
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "mnist_mt/data_source.hpp"

namespace mnist_mt {

struct DownloadRequest {
  DatasetKind kind = DatasetKind::kMnist;
  std::filesystem::path dir;               // created when missing
  std::vector<std::string> extra_mirrors;  // base URLs tried before the published ones
  std::ostream* log = nullptr;             // one line per file fetched
  bool show_progress = false;              // a progress line on stderr (a terminal)
  // Polled during transfers: a nonzero value (the signal) abandons the download at once
  // with Interrupted; the files already verified stay, nothing partial is left.
  std::function<int()> stop_signal{};
};

// Files already present and verified (raw or .gz) are kept. Each transfer has a deadline
// from the file's size (README, "Data"). Throws InputError naming the file and each
// mirror's failure when no mirror gives a verified copy.
void download_dataset(const DownloadRequest& request);

}  // namespace mnist_mt
