#include "progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

namespace mnist_mt {
namespace {

// An ostream does not say where it goes; the standard ones are the ones a terminal
// can be behind.
bool is_terminal(const std::ostream* out) {
  if (out == &std::cout) return isatty(STDOUT_FILENO) != 0;
  if (out == &std::cerr || out == &std::clog) return isatty(STDERR_FILENO) != 0;
  return false;
}

std::string format(const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

std::string duration(double seconds) {
  const long s = std::lround(seconds);
  return s >= 60 ? format("%ld:%02ld", s / 60, s % 60) : format("%lds", s);
}

}  // namespace

Progress::Progress(std::ostream* out, std::uint64_t images_per_step)
    : out_(out), terminal_(is_terminal(out)), images_per_step_(images_per_step) {}

void Progress::start_epoch(std::uint32_t epoch, std::uint32_t steps, std::uint32_t first) {
  epoch_ = epoch;
  steps_ = steps;
  first_ = std::min(first, steps);
  start_ = last_draw_ = Clock::now();
  next_line_ = std::max<std::uint32_t>(1, steps / 10);
}

void Progress::step(std::uint32_t done, double loss) {
  if (out_ == nullptr) return;
  const auto now = Clock::now();
  const bool last = done == steps_;
  // Calls come every few steps (when the stats are read): a log line is due once `done`
  // passes the next tenth of the epoch.
  const std::uint32_t tenth = std::max<std::uint32_t>(1, steps_ / 10);
  if (terminal_ ? (!last && now - last_draw_ < std::chrono::milliseconds(100)) : (!last && done < next_line_)) {
    return;
  }
  last_draw_ = now;
  next_line_ = (done / tenth + 1) * tenth;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const std::uint32_t taken = done > first_ ? done - first_ : 0;  // by this run
  const double rate = elapsed > 0 ? static_cast<double>(taken * images_per_step_) / elapsed : 0.0;
  const double eta = taken > 0 ? elapsed / taken * (steps_ - done) : 0.0;
  const std::string stats = format("loss %.4f  %.0f img/s  ETA %s", loss, rate, duration(eta).c_str());
  if (terminal_) {
    constexpr int kWidth = 30;
    const int filled = steps_ > 0 ? static_cast<int>(kWidth * std::uint64_t{done} / steps_) : kWidth;
    *out_ << '\r'
          << format("epoch %u [%s%s] %u/%u  ", epoch_, std::string(filled, '#').c_str(),
                    std::string(kWidth - filled, '.').c_str(), done, steps_)
          << stats << "\x1b[K" << std::flush;  // erase what a longer line left
    line_open_ = true;
  } else {
    *out_ << format("epoch %u step %u/%u  ", epoch_, done, steps_) << stats << '\n' << std::flush;
  }
}

void Progress::evaluation(std::uint64_t step, double accuracy) {
  if (out_ == nullptr) return;
  if (line_open_) *out_ << '\n';
  line_open_ = false;
  *out_ << format("step %llu: test accuracy %.2f%%", static_cast<unsigned long long>(step), 100.0 * accuracy)
        << std::endl;
}

void Progress::end_epoch(const EpochMetrics& m) {
  if (out_ == nullptr) return;
  if (line_open_) *out_ << '\n';
  line_open_ = false;
  // An epoch resumed at its end, or whose every step was skipped, has no loss to show.
  if (std::isnan(m.train_loss)) {
    *out_ << format("epoch %u: no training loss (%s)", m.epoch, m.steps == 0 ? "no steps" : "every step skipped");
  } else {
    *out_ << format("epoch %u: train loss %.4f", m.epoch, m.train_loss);
  }
  if (!std::isnan(m.test_loss)) {
    *out_ << format(", test loss %.4f, test accuracy %.2f%%", m.test_loss, 100.0 * m.test_accuracy);
  }
  *out_ << format(", %.1f s, %.0f img/s, peak RSS %.0f MiB", m.seconds, m.images_per_s,
                  static_cast<double>(m.peak_rss_bytes) / (1 << 20));
  if (m.skipped_steps > 0) {
    *out_ << format(", %llu of %llu steps skipped (non-finite)", static_cast<unsigned long long>(m.skipped_steps),
                    static_cast<unsigned long long>(m.steps));
  }
  *out_ << std::endl;
  if (m.time_to_target_s) {
    *out_ << format("target reached: test accuracy %.2f%% at step %llu, %.2f s after the first step (%.2f s of it "
                    "evaluating)",
                    100.0 * m.test_accuracy, static_cast<unsigned long long>(*m.target_step), *m.time_to_target_s,
                    *m.target_eval_seconds)
          << std::endl;
  }
}

}  // namespace mnist_mt
