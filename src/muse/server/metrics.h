// Prometheus text exposition with vLLM's metric names under a `muse:` prefix
// (server-api.md §2), so existing vLLM dashboards work after a prefix change.
// Updated and rendered on the HTTP I/O thread only: no locks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "muse/server/generation_service.h"

namespace muse::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double x);
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

// What the request pipeline reports when a request ends.
struct FinishedRequest {
  std::string finished_reason;  // stop, length, abort, error
  int prompt_tokens = 0;
  int generation_tokens = 0;
  double e2e_seconds = 0;
  double ttft_seconds = -1;     // < 0: no token was produced
  double queue_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
};

class ServerMetrics {
 public:
  ServerMetrics(std::string model_name, int max_model_len);
  void http_request(const std::string& handler, const std::string& method, int status);
  void client_disconnected() { ++disconnected_; }
  void inter_token_latency(double seconds) { itl_.observe(seconds); }
  void request_finished(const FinishedRequest& r);
  std::string render(const EngineStats& engine, size_t open_connections) const;

 private:
  std::string model_label_;
  std::map<std::string, uint64_t> http_requests_;    // label set -> count
  std::map<std::string, uint64_t> success_;          // finished_reason -> count
  uint64_t disconnected_ = 0, prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram prompt_len_, gen_len_, ttft_, itl_, e2e_, queue_, prefill_, decode_;
};

}  // namespace muse::server
