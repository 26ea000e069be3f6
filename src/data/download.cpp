#include "mnist_mt/download.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "download_internal.hpp"
#include "file_io.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

namespace fs = std::filesystem;

struct Body {
  std::vector<std::uint8_t> bytes;
  std::uint64_t max_bytes = 0;
  bool too_big = false;
};

std::size_t append(char* data, std::size_t size, std::size_t count, void* user) {
  auto* body = static_cast<Body*>(user);
  const std::size_t n = size * count;
  if (body->bytes.size() + n > body->max_bytes) {
    body->too_big = true;
    return 0;  // makes curl fail the transfer with CURLE_WRITE_ERROR
  }
  body->bytes.insert(body->bytes.end(), data, data + n);
  return n;
}

struct ProgressLine {
  std::string name;
  curl_off_t total = 0;
  curl_off_t mark = -1;  // the percent shown, or 256 KiB units while the size is unknown
  bool shown = false;
};

// Redraws the line only when what it says changes.
int show_progress(void* user, curl_off_t total, curl_off_t now, curl_off_t, curl_off_t) {
  auto* line = static_cast<ProgressLine*>(user);
  if (now == 0) return 0;
  const curl_off_t mark = total > 0 ? 100 * now / total : now / (256 * 1024);
  if (mark == line->mark && total == line->total) return 0;
  line->mark = mark;
  line->total = total;
  line->shown = true;
  if (total > 0) {
    std::fprintf(stderr, "\r%s: %3d%% of %.1f MB", line->name.c_str(), static_cast<int>(mark),
                 static_cast<double>(total) / 1e6);
  } else {
    std::fprintf(stderr, "\r%s: %.1f MB", line->name.c_str(), static_cast<double>(now) / 1e6);
  }
  return 0;
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw RuntimeFailure("libcurl: global init failed");
  });
}

// The body of one GET, or the reason there is none.
struct Fetched {
  std::vector<std::uint8_t> bytes;
  std::string problem;  // empty on success
};

Fetched fetch(const std::string& url, const FetchLimits& limits, ProgressLine* progress) {
  const std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) return {{}, "libcurl: cannot create a handle"};
  Body body{{}, limits.max_bytes, false};
  char error[CURL_ERROR_SIZE] = {};
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  // Redirects only to http(s), TLS with certificate checks (libcurl's default).
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, limits.connect_seconds);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, limits.stall_seconds);
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(limits.max_bytes));
  curl_easy_setopt(c, CURLOPT_USERAGENT, "mnist_mt");
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, append);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  if (progress != nullptr) {
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, show_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, progress);
  }
  const CURLcode rc = curl_easy_perform(c);
  if (progress != nullptr && progress->shown) std::fputc('\n', stderr);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (body.too_big || rc == CURLE_FILESIZE_EXCEEDED) {
    return {{}, "more than " + std::to_string(limits.max_bytes) + " bytes"};
  }
  if (rc != CURLE_OK) return {{}, error[0] != '\0' ? std::string(error) : std::string(curl_easy_strerror(rc))};
  if (status >= 400) return {{}, "HTTP " + std::to_string(status)};
  return {std::move(body.bytes), ""};
}

// Whether `path` exists and holds `file`; a present file that does not verify is an
// error, since the loader would read it instead of the download.
bool present_and_verified(const fs::path& path, const FileSpec& file, const FetchLimits& limits) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return false;
  if (verifies(file, read_file_bytes(path, std::max(limits.max_bytes, file.content_bytes)))) return true;
  if (path.extension() == ".gz") return false;  // replaced by a verified download
  throw InputError(path.string() + ": present but not the published " + file.name + "; remove it to download");
}

void download_file(const DatasetSpec& spec, const FileSpec& file, const fs::path& dir, const FetchLimits& limits,
                   std::ostream* log, bool show) {
  const std::string gz_name = file.name + ".gz";
  const fs::path target = dir / gz_name;
  const bool raw_ok = present_and_verified(dir / file.name, file, limits);
  if (raw_ok || present_and_verified(target, file, limits)) {
    if (log != nullptr) *log << "mnist_mt: " << (raw_ok ? dir / file.name : target).string() << ": present, verified\n";
    return;
  }
  std::string failures;
  for (std::string base : spec.mirrors) {
    if (!base.empty() && base.back() != '/') base += '/';
    const std::string url = base + gz_name;
    ProgressLine line{gz_name};
    Fetched got = fetch(url, limits, show ? &line : nullptr);
    if (got.problem.empty() && !verifies(file, got.bytes)) got.problem = "checksum mismatch";
    if (got.problem.empty()) {
      write_file_atomically(target, got.bytes);
      if (log != nullptr) *log << "mnist_mt: " << target.string() << ": fetched from " << url << ", verified\n";
      return;
    }
    failures += (failures.empty() ? "" : "; ") + url + ": " + got.problem;
  }
  if (failures.empty()) failures = "no mirror to try";
  throw InputError(target.string() + ": download failed: " + failures);
}

}  // namespace

void download_files(const DatasetSpec& spec, const fs::path& dir, const FetchLimits& limits, std::ostream* log,
                    bool show_progress) {
  global_init();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(dir.string() + ": cannot create the download directory: " + ec.message());
  for (const FileSpec& file : spec.files) download_file(spec, file, dir, limits, log, show_progress);
}

void download_dataset(const DownloadRequest& request) {
  DatasetSpec spec = dataset_spec(request.kind);
  spec.mirrors.insert(spec.mirrors.begin(), request.extra_mirrors.begin(), request.extra_mirrors.end());
  download_files(spec, request.dir, FetchLimits{}, request.log, request.show_progress);
}

}  // namespace mnist_mt
