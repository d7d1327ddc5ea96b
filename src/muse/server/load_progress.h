// Shows model loading progress: one rewritten line on a terminal (bytes,
// tensors, rate, time left), or a log line every few seconds otherwise.
#pragma once

#include <chrono>
#include <cstdio>
#include <mutex>

#include "muse/server/generation_service.h"

namespace muse::server {

class LoadProgressReporter {
 public:
  explicit LoadProgressReporter(FILE* out, double log_interval_seconds = 5.0);
  void update(const LoadProgress& p);  // thread-safe; rate-limited
  void done(const LoadProgress& p);    // final line

 private:
  std::string describe(const LoadProgress& p, double elapsed) const;
  FILE* out_;
  bool tty_;
  double interval_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_, last_;
  bool printed_ = false;
};

}  // namespace muse::server
