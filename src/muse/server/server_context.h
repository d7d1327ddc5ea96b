// What handling a request needs from the server, and nothing more: the
// options, the backend, the metrics, a way to wake the I/O thread, and the
// set of running generations. ApiServer owns it; the routes
// (api_server.cc), admission and the jobs (generation_job.cc) get it by
// reference, so none of them reaches into ApiServer's own state (HTTP
// server, pools, readiness, shutdown).
//
// Threads: options and backend are immutable after construction and may be
// read from the request pool; metrics and jobs belong to the I/O thread; the
// poster has its own lock.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

#include "muse/server/api_error.h"
#include "muse/server/api_request.h"
#include "muse/server/api_server.h"
#include "muse/server/http_server.h"
#include "muse/server/metrics.h"

namespace muse::server {

class GenerationJob;

// Lets engine and pool threads wake the I/O thread without owning the
// server: ApiServer detaches it on destruction, after which posts are dropped.
struct IoPoster {
  std::mutex mu;
  HttpServer* http = nullptr;
  void post(std::function<void()> fn) {
    std::lock_guard lock(mu);
    if (http) http->post(std::move(fn));
  }
};

struct ServerContext {
  ApiServerOptions opt;
  ServeBackend backend;
  std::unique_ptr<ServerMetrics> metrics;
  std::shared_ptr<IoPoster> poster = std::make_shared<IoPoster>();
  std::unordered_set<std::shared_ptr<GenerationJob>> jobs;  // running generations (I/O thread)

  const std::string& served_name() const { return opt.served_model_names.front(); }
  ValidationLimits limits() const;
  // An error in the envelope of the API the path belongs to.
  HttpResponse error_response(const ApiError& e, std::string_view path) const;
  void respond_error(HttpExchange& ex, const ApiError& e) const;
};

// Something threw while handling `ex`: logs it and answers 500 if still possible.
void internal_error(const ServerContext& ctx, HttpExchange& ex, const char* what);
// Random ids: chatcmpl-…, call_…, msg_…
std::string random_id(const char* prefix, size_t length);

}  // namespace muse::server
