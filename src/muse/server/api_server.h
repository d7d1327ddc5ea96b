// The OpenAI/Anthropic-compatible API on top of HttpServer: routing, API
// keys, CORS, /health, /metrics, /v1/models, /tokenize, /detokenize,
// /version, and the generation endpoints (generation_job.cc), plus graceful
// shutdown. Everything runs on the HTTP I/O thread except set_ready() and
// shutdown(), which may be called from anywhere.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "muse/core/status.h"
#include "muse/server/generation_service.h"
#include "muse/server/http_server.h"
#include "muse/server/response_writer.h"

namespace muse::server {

struct ApiServerOptions {
  HttpServerOptions http;
  std::vector<std::string> served_model_names;  // first: the name reported back
  std::string api_key;                          // empty: no authentication
  // CORS: off while allowed_origins is empty; "*" allows any origin.
  std::vector<std::string> allowed_origins;
  std::vector<std::string> allowed_methods = {"*"};
  std::vector<std::string> allowed_headers = {"*"};
  bool allow_credentials = false;
  ReasoningFields reasoning_fields = ReasoningFields::Both;
  bool force_include_usage = false;       // --enable-force-include-usage
  bool enable_auto_tool_choice = true;    // tool_choice "auto" allowed
  bool use_generation_config = true;      // --generation-config auto: model defaults for sampling
  int max_logprobs = 20;
  double sse_keepalive_seconds = 15;      // ": keep-alive" comments while a stream is silent
  int shutdown_grace_seconds = 30;        // running requests may finish within this
  // A whole (non-streamed) response is built in memory before it is sent:
  // requests whose worst case (choices x max_tokens x logprobs) exceeds this
  // are refused up front (400, naming the limit); streaming has no limit.
  size_t max_response_bytes = 512u << 20;
  // Threads that parse, validate, render and tokenize requests (plus one for
  // bodies over 4 MiB), and how many requests may wait for them (then 503).
  int request_workers = 2;
  int max_queued_requests = 256;
  bool log_requests = true;
};

class ApiServer {
 public:
  ApiServer(ApiServerOptions options, ServeBackend backend);
  ~ApiServer();
  Status listen();
  int port() const;
  // Thread-safe. Until called, /health and model routes answer 503.
  void set_ready();
  // Serves until shutdown completes (SIGINT/SIGTERM or shutdown()).
  void run();
  // Thread-safe: stop admitting, let running requests finish within the grace
  // period, then cancel them; run() returns when all are done.
  void shutdown();

  // api_server.cc: the ServerContext the handlers see (server_context.h)
  // plus the HTTP server, request pools, readiness and shutdown.
  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace muse::server
