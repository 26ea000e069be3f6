#include "mnist_mt/download.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "download_internal.hpp"
#include "mnist_mt/file_io.hpp"
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
void show_progress(ProgressLine& line, curl_off_t total, curl_off_t now) {
  if (now == 0) return;
  const curl_off_t mark = total > 0 ? 100 * now / total : now / (256 * 1024);
  if (mark == line.mark && total == line.total) return;
  line.mark = mark;
  line.total = total;
  line.shown = true;
  if (total > 0) {
    std::fprintf(stderr, "\r%s: %3d%% of %.1f MB", line.name.c_str(), static_cast<int>(mark),
                 static_cast<double>(total) / 1e6);
  } else {
    std::fprintf(stderr, "\r%s: %.1f MB", line.name.c_str(), static_cast<double>(now) / 1e6);
  }
}

// What libcurl's progress callback sees of one transfer.
struct Watch {
  ProgressLine* progress;                   // null: no line
  const std::function<int()>* stop_signal;  // polled; may be empty
  int signal = 0;                           // the one that abandoned the transfer
};

// Called as data arrives and about once a second while none does.
int on_progress(void* user, curl_off_t total, curl_off_t now, curl_off_t, curl_off_t) {
  auto* watch = static_cast<Watch*>(user);
  if (*watch->stop_signal && (watch->signal = (*watch->stop_signal)()) != 0) return 1;  // aborts the transfer
  if (watch->progress != nullptr) show_progress(*watch->progress, total, now);
  return 0;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, seconds < 10 ? "%.1f s" : "%.0f s", seconds);
  return text;
}

[[noreturn]] void interrupted(const fs::path& target, int signal) {
  const char* abbrev = sigabbrev_np(signal);
  throw Interrupted(target.string() + ": download abandoned (" +
                        (abbrev != nullptr ? "SIG" + std::string(abbrev) : "signal " + std::to_string(signal)) +
                        "); no partial file is left",
                    signal);
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

// `deadline`: the seconds the whole transfer may take.
Fetched fetch(const std::string& url, const FetchLimits& limits, double deadline, Watch& watch) {
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
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(std::ceil(deadline * 1000)));
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(limits.max_bytes));
  curl_easy_setopt(c, CURLOPT_USERAGENT, "mnist_mt");
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, append);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &watch);
  const auto start = std::chrono::steady_clock::now();
  const CURLcode rc = curl_easy_perform(c);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (watch.progress != nullptr && watch.progress->shown) std::fputc('\n', stderr);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (body.too_big || rc == CURLE_FILESIZE_EXCEEDED) {
    return {{}, "more than " + std::to_string(limits.max_bytes) + " bytes"};
  }
  const std::string why = error[0] != '\0' ? std::string(error) : std::string(curl_easy_strerror(rc));
  // libcurl counts whole milliseconds, and may end the transfer a little before `took`
  // reaches the deadline.
  if (rc == CURLE_OPERATION_TIMEDOUT && took >= 0.99 * deadline)
    return {{}, "not done within its deadline of " + seconds_text(deadline) + " (" + why + ")"};
  if (rc != CURLE_OK) return {{}, why};
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
                   std::ostream* log, bool show, const std::function<int()>& stop_signal) {
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
    Watch watch{show ? &line : nullptr, &stop_signal};
    Fetched got = fetch(url, limits, deadline_seconds(limits, file.content_bytes), watch);
    if (watch.signal != 0) interrupted(target, watch.signal);
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

double deadline_seconds(const FetchLimits& limits, std::uint64_t bytes) {
  return std::max(limits.min_deadline_seconds, static_cast<double>(bytes) / limits.min_bytes_per_second);
}

void download_files(const DatasetSpec& spec, const fs::path& dir, const FetchLimits& limits, std::ostream* log,
                    bool show_progress, const std::function<int()>& stop_signal) {
  global_init();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(dir.string() + ": cannot create the download directory: " + ec.message());
  for (const FileSpec& file : spec.files) download_file(spec, file, dir, limits, log, show_progress, stop_signal);
}

void download_dataset(const DownloadRequest& request) {
  DatasetSpec spec = dataset_spec(request.kind);
  spec.mirrors.insert(spec.mirrors.begin(), request.extra_mirrors.begin(), request.extra_mirrors.end());
  download_files(spec, request.dir, FetchLimits{}, request.log, request.show_progress, request.stop_signal);
}

}  // namespace mnist_mt
