// State shared by api_server.cc (routes) and generation_job.cc (the
// generation endpoints). I/O thread only, except the atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

#include "muse/server/api_request.h"
#include "muse/server/api_server.h"
#include "muse/server/metrics.h"
#include "muse/server/request_pool.h"

namespace muse::server {

class GenerationJob;

// Lets engine threads wake the I/O thread without owning the server: the
// ApiServer detaches it on destruction, after which wake-ups are dropped.
struct IoPoster {
  std::mutex mu;
  HttpServer* http = nullptr;
  void post(std::function<void()> fn) {
    std::lock_guard lock(mu);
    if (http) http->post(std::move(fn));
  }
};

struct ApiServer::State {
  ApiServerOptions opt;
  ServeBackend backend;
  std::unique_ptr<HttpServer> http;
  std::shared_ptr<IoPoster> poster = std::make_shared<IoPoster>();
  std::unique_ptr<ServerMetrics> metrics;
  std::atomic<bool> ready{false};
  std::atomic<bool> shutting_down{false};
  std::chrono::steady_clock::time_point shutdown_started;
  bool cancelled_for_shutdown = false;
  std::unordered_set<std::shared_ptr<GenerationJob>> jobs;  // running generations
  // Parsing, validation, rendering and tokenizing run here, off the I/O
  // thread; bodies over kLargeBody take the one-thread lane, so a few huge
  // requests can neither starve the small ones nor multiply their memory.
  std::unique_ptr<RequestPool> pool, large_pool;
  static constexpr size_t kLargeBody = 4u << 20;
  int pending = 0;  // requests handed to a pool and not yet back (I/O thread)

  const std::string& served_name() const { return opt.served_model_names.front(); }
  ValidationLimits limits() const;
  // The body of an error in the envelope of the API the path belongs to.
  HttpResponse error_response(const ApiError& e, std::string_view path) const;
  void respond_error(HttpExchange& ex, const ApiError& e);
  void finish_job(const std::shared_ptr<GenerationJob>& job);
};

// The API key and the media type, from the head only (401 / 415), or nullopt.
std::optional<ApiError> check_request_head(const ApiServer::State& state, const HttpRequest& req);
// Something threw while handling `ex`: logs it and answers 500 if still possible.
void internal_error(ApiServer::State& state, HttpExchange& ex, const char* what);

// Cancels every running generation (shutdown after the grace period).
void cancel_all_jobs(ApiServer::State& state);
// Writes keep-alive comments on streams that have been silent too long.
void send_keepalives(ApiServer::State& state);
// Random ids: chatcmpl-…, call_…, msg_…
std::string random_id(const char* prefix, size_t length);

}  // namespace muse::server
