// Levelled logging to stderr. One global level set from the command line
// (--log-level); request ids go in the message as "[req-…]".
#pragma once

#include <cstdarg>
#include <string_view>

namespace muse {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
bool parse_log_level(std::string_view name, LogLevel* out);

void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace muse

#define MUSE_LOG(level, ...)                                                      \
  do {                                                                            \
    if (int(::muse::LogLevel::level) >= int(::muse::log_level()))                 \
      ::muse::log_message(::muse::LogLevel::level, __VA_ARGS__);                  \
  } while (0)
#define LOG_DEBUG(...) MUSE_LOG(Debug, __VA_ARGS__)
#define LOG_INFO(...) MUSE_LOG(Info, __VA_ARGS__)
#define LOG_WARN(...) MUSE_LOG(Warn, __VA_ARGS__)
#define LOG_ERROR(...) MUSE_LOG(Error, __VA_ARGS__)
