#include "muse/server/load_progress.h"

#include <string>
#include <unistd.h>

#include "muse/core/log.h"

namespace muse::server {

LoadProgressReporter::LoadProgressReporter(FILE* out, double log_interval_seconds)
    : out_(out), tty_(isatty(fileno(out)) != 0), interval_(log_interval_seconds),
      start_(std::chrono::steady_clock::now()), last_(start_) {}

std::string LoadProgressReporter::describe(const LoadProgress& p, double elapsed) const {
  const double gib = 1024.0 * 1024 * 1024;
  char buf[256];
  double frac = p.bytes_total ? double(p.bytes_done) / double(p.bytes_total) : 0;
  double rate = elapsed > 0 ? double(p.bytes_done) / elapsed : 0;
  double left = rate > 0 && p.bytes_total > p.bytes_done ? double(p.bytes_total - p.bytes_done) / rate : 0;
  std::snprintf(buf, sizeof buf, "loading: %.2f / %.2f GiB (%.0f%%), %llu / %llu tensors, %.2f GiB/s, %.0f s left",
                double(p.bytes_done) / gib, double(p.bytes_total) / gib, frac * 100, (unsigned long long)p.tensors_done,
                (unsigned long long)p.tensors_total, rate / gib, left);
  return buf;
}

void LoadProgressReporter::update(const LoadProgress& p) {
  std::lock_guard lock(mu_);
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_).count();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  if (tty_) {
    if (printed_ && since < 0.1) return;
    std::fprintf(out_, "\r\033[K%s", describe(p, elapsed).c_str());
    std::fflush(out_);
  } else {
    if (since < interval_) return;
    LOG_INFO("%s", describe(p, elapsed).c_str());
  }
  printed_ = true;
  last_ = now;
}

void LoadProgressReporter::done(const LoadProgress& p) {
  std::lock_guard lock(mu_);
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tty_ && printed_) std::fprintf(out_, "\r\033[K");
  LOG_INFO("model loaded: %.2f GiB, %llu tensors in %.1f s", double(p.bytes_total) / (1024.0 * 1024 * 1024),
           (unsigned long long)p.tensors_total, elapsed);
}

}  // namespace muse::server
