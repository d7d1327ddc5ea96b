#include "muse/core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace muse {

namespace {
std::atomic<int> g_level{int(LogLevel::Info)};
std::mutex g_mutex;
}  // namespace

void set_log_level(LogLevel level) { g_level = int(level); }
LogLevel log_level() { return LogLevel(g_level.load(std::memory_order_relaxed)); }

bool parse_log_level(std::string_view name, LogLevel* out) {
  if (name == "debug") *out = LogLevel::Debug;
  else if (name == "info") *out = LogLevel::Info;
  else if (name == "warn" || name == "warning") *out = LogLevel::Warn;
  else if (name == "error") *out = LogLevel::Error;
  else if (name == "off") *out = LogLevel::Off;
  else return false;
  return true;
}

void log_message(LogLevel level, const char* fmt, ...) {
  static const char* names[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm;
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%m-%d %H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "%s %s.%03d %s\n", names[int(level)], ts, ms, buf);
}

}  // namespace muse
