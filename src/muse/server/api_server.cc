// Routes, authentication, CORS and the small endpoints. The generation
// endpoints live in generation_job.cc.
#include "muse/server/api_server.h"

#include <algorithm>
#include <cctype>
#include <csignal>
#include <ctime>
#include <random>

#include "muse/core/log.h"
#include "muse/server/generation_job.h"
#include "muse/server/request_pool.h"
#include "muse/server/server_context.h"

namespace muse::server {

namespace {

using Clock = std::chrono::steady_clock;

// Compares every byte whatever the first difference, so response time does
// not reveal how much of a guessed key was right.
bool constant_time_equal(std::string_view a, std::string_view b) {
  volatile unsigned char diff = a.size() != b.size();
  size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    diff = diff | (static_cast<unsigned char>(i < a.size() ? a[i] : 0) ^ static_cast<unsigned char>(i < b.size() ? b[i] : 0));
  return diff == 0;
}

// Adds headers (CORS, X-Request-Id) to whatever response goes out, and
// counts it in http_requests_total once its status is known.
class TrackedExchange : public HttpExchange {
 public:
  TrackedExchange(std::shared_ptr<HttpExchange> inner, HttpHeaders extra, ServerMetrics* metrics, std::string handler)
      : inner_(std::move(inner)), extra_(std::move(extra)), metrics_(metrics), handler_(std::move(handler)),
        start_(Clock::now()) {}
  const HttpRequest& request() const override { return inner_->request(); }
  void respond(HttpResponse r) override {
    count(r.status);
    r.headers.insert(r.headers.end(), extra_.begin(), extra_.end());
    inner_->respond(std::move(r));
  }
  void start_stream(int status, std::string content_type, HttpHeaders headers) override {
    count(status);
    headers.insert(headers.end(), extra_.begin(), extra_.end());
    inner_->start_stream(status, std::move(content_type), std::move(headers));
  }
  void write(std::string data) override { inner_->write(std::move(data)); }
  void end_stream() override { inner_->end_stream(); }
  bool closed() const override { return inner_->closed(); }
  void on_close(std::function<void()> fn) override { inner_->on_close(std::move(fn)); }
  size_t queued_bytes() const override { return inner_->queued_bytes(); }
  bool finished() const override { return inner_->finished(); }

 private:
  void count(int status) {
    if (counted_) return;
    counted_ = true;
    metrics_->http_request(handler_, inner_->request().method, status);
    if (status >= 400 || log_level() <= LogLevel::Debug) {
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
      MUSE_LOG(Info, "http %s %s from %s -> %d (%.1f ms)", inner_->request().method.c_str(), inner_->request().path.c_str(),
               inner_->request().remote.c_str(), status, ms);
    }
  }
  std::shared_ptr<HttpExchange> inner_;
  HttpHeaders extra_;
  ServerMetrics* metrics_;
  std::string handler_;
  Clock::time_point start_;
  bool counted_ = false;
};

HttpResponse json_response(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

// The server's own state: the request context handlers see, plus what only
// the server itself uses (the HTTP server, the request pools, readiness and
// shutdown). I/O thread only, except the atomics.
struct ApiServer::State : ServerContext {
  std::unique_ptr<HttpServer> http;
  std::atomic<bool> ready{false};
  std::atomic<bool> shutting_down{false};
  std::chrono::steady_clock::time_point shutdown_started;
  bool cancelled_for_shutdown = false;
  // Parsing, validation, rendering and tokenizing run here, off the I/O
  // thread; bodies over kLargeBody take the one-thread lane, so a few huge
  // requests can neither starve the small ones nor multiply their memory.
  std::unique_ptr<RequestPool> pool, large_pool;
  static constexpr size_t kLargeBody = 4u << 20;
  int pending = 0;  // requests handed to a pool and not yet back (I/O thread)
};

namespace {

using State = ApiServer::State;

ApiError not_found_route(const HttpRequest& req) {
  ApiError e;
  e.status = 404;
  e.message = "No route for " + req.method + " " + req.path + ".";
  e.code = "not_found";
  return e;
}

ApiError unavailable(const State& s) {
  ApiError e;
  e.status = 503;
  e.type = "service_unavailable";
  e.message = s.shutting_down ? "The server is shutting down." : "The model is loading; try again shortly.";
  e.code = s.shutting_down ? "server_shutting_down" : "model_loading";
  return e;
}

Json model_card(const State& s, const std::string& name) {
  Json m = Json::object();
  m.set("id", name);
  m.set("object", "model");
  m.set("created", int64_t(std::time(nullptr)));
  m.set("owned_by", "muse");
  m.set("root", s.served_name());
  m.set("parent", Json());
  if (s.ready) m.set("max_model_len", s.backend.adapter->info().max_model_len);
  return m;
}

void handle_tokenize(State& s, HttpExchange& ex, const Json& body) {
  Json out = Json::object();
  std::vector<int32_t> ids;
  if (body.find("messages")) {
    ApiRequest req;
    if (auto e = parse_chat_request(body, s.limits(), &req)) return s.respond_error(ex, *e);
    auto rendered = s.backend.adapter->render_chat(body, ChatApi::OpenAI);
    if (!rendered.ok()) return s.respond_error(ex, invalid_param("messages", rendered.message(), "invalid_value"));
    if (rendered->exceeds_context)
      return s.respond_error(ex, invalid_param("messages", "The messages are longer than the context of " +
                                                               std::to_string(s.backend.adapter->info().max_model_len) + " tokens can hold.",
                                               "context_length_exceeded"));
    ids = rendered->ids;
  } else {
    const Json* prompt = body.find("prompt");
    if (!prompt || !prompt->is_string())
      return s.respond_error(ex, invalid_param("prompt", "Missing required parameter: 'prompt' (a string) or 'messages'.",
                                               "missing_required_parameter"));
    auto add = body.bool_member("add_special_tokens", true);
    if (!add.ok()) return s.respond_error(ex, invalid_type("add_special_tokens", "a boolean", "another type"));
    auto r = s.backend.adapter->tokenize(prompt->as_string(), *add);
    if (!r.ok()) return s.respond_error(ex, invalid_param("prompt", r.message()));
    ids = std::move(r).value();
  }
  Json tokens = Json::array();
  for (int32_t id : ids) tokens.push_back(int64_t(id));
  out.set("count", int64_t(ids.size()));
  out.set("max_model_len", s.backend.adapter->info().max_model_len);
  out.set("tokens", std::move(tokens));
  out.set("token_strs", Json());
  ex.respond(json_response(200, out.dump()));
}

void handle_detokenize(State& s, HttpExchange& ex, const Json& body) {
  const Json* tokens = body.find("tokens");
  if (!tokens || !tokens->is_array())
    return s.respond_error(ex, invalid_param("tokens", "Missing required parameter: 'tokens' (an array of token ids).",
                                             "missing_required_parameter"));
  std::vector<int32_t> ids;
  for (const auto& t : tokens->as_array()) {
    if (!t.is_int() || t.as_int() < 0 || t.as_int() > INT32_MAX)
      return s.respond_error(ex, invalid_param("tokens", "Invalid 'tokens': each must be a non-negative integer token id."));
    ids.push_back(int32_t(t.as_int()));
  }
  auto text = s.backend.adapter->detokenize(ids, false);
  if (!text.ok()) return s.respond_error(ex, invalid_param("tokens", text.message()));
  Json out = Json::object();
  out.set("prompt", sanitize_utf8(*text));
  ex.respond(json_response(200, out.dump()));
}

// Metric label: the route, never the raw path (unknown paths would make
// unbounded label sets).
std::string route_label(std::string_view path) {
  static const char* kRoutes[] = {"/health", "/metrics", "/version", "/v1/models", "/v1/chat/completions", "/v1/completions",
                                  "/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/tokenize", "/detokenize"};
  for (const char* r : kRoutes)
    if (path == r) return r;
  return path.starts_with("/v1/models/") ? "/v1/models/{model}" : path.starts_with("/v1/responses/") ? "/v1/responses/{id}" : "other";
}

bool is_json_route(std::string_view path) {
  static const char* kPost[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                                "/v1/responses", "/tokenize", "/detokenize"};
  for (const char* p : kPost)
    if (path == p) return true;
  return false;
}

bool is_json_media_type(const std::string* content_type) {
  if (!content_type) return false;
  std::string_view v = *content_type;
  v = v.substr(0, v.find(';'));
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  static constexpr std::string_view kJson = "application/json";
  if (v.size() != kJson.size()) return false;
  for (size_t i = 0; i < v.size(); ++i)
    if (char(std::tolower(static_cast<unsigned char>(v[i]))) != kJson[i]) return false;
  return true;
}

// What can be decided from the head alone: the API key, then the media type.
// HttpServer runs it before reading (or 100-continuing) any body, so neither
// a keyless client nor a cross-site form post gets a body buffered; route()
// runs it again for requests that arrive whole.
std::optional<ApiError> check_request_head(const State& s, const HttpRequest& req) {
  // Only the JSON routes read a body: any other route refuses one from the
  // head, so the open routes cannot be used to make the server buffer bytes.
  const std::string* length = req.header("content-length");
  bool has_body = (length && *length != "0") || req.header("transfer-encoding");
  if (has_body && !is_json_route(req.path)) {
    if (route_label(req.path) == "other") return not_found_route(req);
    return ApiError{413, "invalid_request_error", req.method + " " + req.path + " takes no request body.", "", "request_too_large"};
  }
  // /health and /metrics are open: monitoring must not need the key (vLLM
  // protects only /v1/*; here every other route stays protected).
  if (req.method == "OPTIONS" || req.path == "/health" || req.path == "/metrics") return std::nullopt;
  if (!s.opt.api_key.empty()) {
    std::string given;
    if (const std::string* auth = req.header("authorization"); auth && auth->starts_with("Bearer ")) given = auth->substr(7);
    else if (const std::string* key = req.header("x-api-key")) given = *key;
    if (!constant_time_equal(given, s.opt.api_key))
      return ApiError{401, "authentication_error", "Invalid or missing API key. Send it as 'Authorization: Bearer <key>' (or 'x-api-key').", "", "invalid_api_key"};
  }
  // A browser may post text/plain or a form cross-site without a preflight;
  // only application/json bodies are read (as vLLM does).
  if (req.method == "POST" && is_json_route(req.path) && !is_json_media_type(req.header("content-type")))
    return ApiError{415, "invalid_request_error", "Unsupported Media Type: only 'application/json' is allowed (got " +
                                                      (req.header("content-type") ? "'" + *req.header("content-type") + "'" : std::string("none")) + ").",
                    "", "unsupported_media_type"};
  return std::nullopt;
}

// Collects what a handler answers on a request-pool thread; the I/O thread
// replays it on the real exchange. Reads the request (immutable) only.
class DeferredExchange : public HttpExchange {
 public:
  explicit DeferredExchange(const HttpRequest& req) : req_(req) {}
  const HttpRequest& request() const override { return req_; }
  void respond(HttpResponse r) override {
    if (!response) response = std::move(r);
  }
  void start_stream(int, std::string, HttpHeaders) override {}
  void write(std::string) override {}
  void end_stream() override {}
  bool closed() const override { return false; }
  void on_close(std::function<void()>) override {}
  size_t queued_bytes() const override { return 0; }
  bool finished() const override { return response.has_value(); }
  std::optional<HttpResponse> response;

 private:
  const HttpRequest& req_;
};

// What a pool thread hands back to the I/O thread.
struct Prepared {
  std::optional<HttpResponse> response;          // answered (an error, or /tokenize ...)
  std::optional<PreparedGeneration> generation;  // or ready to start
  std::string failure;                           // or it threw
};

// The body-parsing endpoints run on the request pool; the I/O thread only
// replays the answer or starts the generation. A full pool is a 503.
void dispatch(const std::shared_ptr<State>& sp, std::shared_ptr<HttpExchange> ex, std::optional<Endpoint> endpoint) {
  State& s = *sp;
  std::weak_ptr<State> weak = sp;
  RequestPool& pool = ex->request().body.size() > State::kLargeBody ? *s.large_pool : *s.pool;
  auto work = [weak, ex, endpoint] {
    auto s = weak.lock();
    if (!s) return;
    auto out = std::make_shared<Prepared>();
    DeferredExchange d(ex->request());
    const std::string& path = d.request().path;
    try {
      Json body;
      if (auto e = parse_json_body(d.request().body, &body)) s->respond_error(d, *e);
      else if (path == "/tokenize") handle_tokenize(*s, d, body);
      else if (path == "/detokenize") handle_detokenize(*s, d, body);
      else if (path == "/v1/messages/count_tokens") handle_count_tokens(*s, d, body);
      else out->generation = prepare_generation(*s, d, *endpoint, std::move(body));
    } catch (const std::exception& e) {
      out->failure = e.what();
    } catch (...) {
      out->failure = "unknown exception";
    }
    out->response = std::move(d.response);
    s->poster->post([weak, ex, out] {
      auto s = weak.lock();
      if (!s) return;
      --s->pending;
      try {
        if (!out->failure.empty()) return internal_error(*s, *ex, out->failure.c_str());
        if (out->response) return ex->respond(std::move(*out->response));
        if (!out->generation) return;
        if (s->shutting_down)
          return s->respond_error(*ex, ApiError{503, "service_unavailable", "The server is shutting down.", "", "server_shutting_down"});
        start_generation(*s, ex, std::move(*out->generation));
      } catch (const std::exception& e) {
        internal_error(*s, *ex, e.what());
      }
    });
  };
  ++s.pending;
  if (!pool.try_submit(std::move(work))) {
    --s.pending;
    s.respond_error(*ex, ApiError{503, "service_unavailable", "The server has too many requests waiting to be prepared; retry shortly.",
                                  "", "server_overloaded"});
  }
}

void route(const std::shared_ptr<State>& sp, std::shared_ptr<HttpExchange> raw) {
  State& s = *sp;
  const HttpRequest& req = raw->request();
  const std::string& path = req.path;
  const std::string& method = req.method;

  // CORS (off unless --allowed-origins): answer preflights, tag responses.
  HttpHeaders extra;
  const std::string* origin = req.header("origin");
  bool cors = false;
  if (origin && !s.opt.allowed_origins.empty()) {
    for (const auto& o : s.opt.allowed_origins) cors |= o == "*" || o == *origin;
    if (cors) {
      bool any = std::find(s.opt.allowed_origins.begin(), s.opt.allowed_origins.end(), "*") != s.opt.allowed_origins.end();
      extra.emplace_back("Access-Control-Allow-Origin", any && !s.opt.allow_credentials ? "*" : *origin);
      if (!(any && !s.opt.allow_credentials)) extra.emplace_back("Vary", "Origin");
      if (s.opt.allow_credentials) extra.emplace_back("Access-Control-Allow-Credentials", "true");
    }
  }
  auto ex = std::make_shared<TrackedExchange>(std::move(raw), extra, s.metrics.get(), route_label(path));
  if (method == "OPTIONS") {
    if (!cors) return s.respond_error(*ex, ApiError{405, "invalid_request_error", "CORS is not enabled for this origin.", "", "method_not_allowed"});
    HttpResponse r;
    r.status = 204;
    r.content_type.clear();
    const std::string* want_headers = req.header("access-control-request-headers");
    auto allowed = [](const std::vector<std::string>& v, const std::string& fallback) {
      return std::find(v.begin(), v.end(), "*") != v.end() ? fallback : join(v);
    };
    r.headers.emplace_back("Access-Control-Allow-Methods", allowed(s.opt.allowed_methods, "GET, POST, OPTIONS"));
    r.headers.emplace_back("Access-Control-Allow-Headers",
                           allowed(s.opt.allowed_headers, want_headers ? *want_headers : "Authorization, Content-Type, X-Api-Key"));
    r.headers.emplace_back("Access-Control-Max-Age", "600");
    return ex->respond(std::move(r));
  }

  if (path == "/health") {
    if (!s.ready || s.shutting_down) return s.respond_error(*ex, unavailable(s));
    HttpResponse r = json_response(200, "");
    r.content_type.clear();
    return ex->respond(std::move(r));
  }

  if (auto e = check_request_head(s, req)) return s.respond_error(*ex, *e);

  auto expect_method = [&](const char* m) {
    if (method == m || (std::string_view(m) == "GET" && method == "HEAD")) return true;
    HttpResponse r = s.error_response(ApiError{405, "invalid_request_error", "Method " + method + " is not allowed on " + path + "; use " + m + ".", "", "method_not_allowed"}, path);
    r.headers.emplace_back("Allow", m);
    ex->respond(std::move(r));
    return false;
  };

  if (path == "/version") {
    if (!expect_method("GET")) return;
    return ex->respond(json_response(200, std::string("{\"version\":\"") + MUSE_VERSION + "\"}"));
  }
  if (path == "/metrics") {
    if (!expect_method("GET")) return;
    EngineStats stats = s.ready ? s.backend.service->stats() : EngineStats{};
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = s.metrics->render(stats, s.http->open_connections());
    return ex->respond(std::move(r));
  }
  if (path.starts_with("/v1/responses/")) {  // retrieve / cancel / input_items
    return s.respond_error(*ex, ApiError{404, "invalid_request_error",
                                         "Responses are not stored by this server (store is not supported), so '" + path +
                                             "' cannot be found; send the conversation as input items instead.",
                                         "response_id", "not_found"});
  }
  if (path == "/v1/models" || path.starts_with("/v1/models/")) {
    if (!expect_method("GET")) return;
    if (path == "/v1/models") {
      Json data = Json::array();
      for (const auto& name : s.opt.served_model_names) data.push_back(model_card(s, name));
      Json out = Json::object();
      out.set("object", "list");
      out.set("data", std::move(data));
      return ex->respond(json_response(200, out.dump()));
    }
    std::string id = path.substr(11);
    for (const auto& name : s.opt.served_model_names)
      if (name == id) return ex->respond(json_response(200, model_card(s, name).dump()));
    return s.respond_error(*ex, ApiError{404, "invalid_request_error", "The model `" + id + "` does not exist. Served models: " + join(s.opt.served_model_names) + ".", "model", "model_not_found"});
  }

  static const std::pair<const char*, Endpoint> kGeneration[] = {
      {"/v1/chat/completions", Endpoint::ChatCompletions},
      {"/v1/completions", Endpoint::Completions},
      {"/v1/messages", Endpoint::Messages},
      {"/v1/messages/count_tokens", Endpoint::Messages},
      {"/v1/responses", Endpoint::Responses},
  };
  bool is_tokenize = path == "/tokenize" || path == "/detokenize";
  const std::pair<const char*, Endpoint>* gen = nullptr;
  for (const auto& g : kGeneration)
    if (path == g.first) gen = &g;
  if (!gen && !is_tokenize) return s.respond_error(*ex, not_found_route(req));
  if (!expect_method("POST")) return;
  if (!s.ready || (s.shutting_down && gen)) return s.respond_error(*ex, unavailable(s));
  dispatch(sp, std::move(ex), gen ? std::optional<Endpoint>(gen->second) : std::nullopt);
}

}  // namespace

ApiServer::ApiServer(ApiServerOptions options, ServeBackend backend) : state_(std::make_shared<State>()) {
  state_->opt = std::move(options);
  if (state_->opt.served_model_names.empty()) state_->opt.served_model_names.push_back("muse");
  state_->backend = std::move(backend);
  state_->metrics = std::make_unique<ServerMetrics>(state_->served_name(), state_->backend.adapter->info().max_model_len);
  state_->pool = std::make_unique<RequestPool>(state_->opt.request_workers, size_t(std::max(1, state_->opt.max_queued_requests)));
  state_->large_pool = std::make_unique<RequestPool>(1, size_t(std::max(1, state_->opt.max_queued_requests / 16)));
  std::weak_ptr<State> weak = state_;
  state_->http = std::make_unique<HttpServer>(
      state_->opt.http,
      [weak](std::shared_ptr<HttpExchange> ex) {
        auto s = weak.lock();
        if (!s) return;
        // Defence in depth: a bug that throws while handling one request
        // costs that request a 500, never the process.
        try {
          route(s, ex);
        } catch (const std::exception& e) {
          internal_error(*s, *ex, e.what());
        } catch (...) {
          internal_error(*s, *ex, "unknown exception");
        }
      },
      [weak](int status, std::string_view path, std::string message) {
        ApiError e;
        e.status = status;
        e.message = std::move(message);
        e.code = status == 413   ? "request_too_large"
                 : status == 431 ? "headers_too_large"
                 : status == 408 ? "request_timeout"
                 : status == 501 ? "unsupported_transfer_encoding"
                 : status == 503 ? "server_overloaded"  // too many connections, or the request-buffer budget
                                 : "invalid_http";
        if (status == 503) e.type = "service_unavailable";
        auto s = weak.lock();
        return s ? s->error_response(e, path) : HttpResponse{status, "application/json", {}, openai_error_body(e)};
      });
  // The key and the media type are checked from the head, before any body
  // is read (no 100 Continue for a keyless client).
  state_->http->on_head([weak](const HttpRequest& head) -> std::optional<HttpResponse> {
    auto s = weak.lock();
    if (!s) return std::nullopt;
    auto e = check_request_head(*s, head);
    if (!e) return std::nullopt;
    s->metrics->http_request(route_label(head.path), head.method, e->status);
    MUSE_LOG(Info, "http %s %s from %s -> %d (before the body)", head.method.c_str(), head.path.c_str(), head.remote.c_str(), e->status);
    return s->error_response(*e, head.path);
  });
  state_->poster->http = state_->http.get();
}

ApiServer::~ApiServer() {
  {
    std::lock_guard lock(state_->poster->mu);
    state_->poster->http = nullptr;
  }
  // Joined first: a pool thread may hold the state while it finishes a task.
  state_->pool.reset();
  state_->large_pool.reset();
  state_->jobs.clear();
}

Status ApiServer::listen() { return state_->http->listen(); }
int ApiServer::port() const { return state_->http->port(); }
void ApiServer::set_ready() { state_->ready = true; }

void ApiServer::shutdown() {
  std::weak_ptr<State> weak = state_;
  state_->http->post([weak] {
    auto s = weak.lock();
    if (!s) return;
    if (s->shutting_down) {
      // A second signal: do not wait for the grace period.
      LOG_WARN("shutdown: second signal, cancelling %zu running request(s) now", s->jobs.size());
      cancel_all_jobs(*s);
      s->cancelled_for_shutdown = true;
      return;
    }
    s->shutting_down = true;
    s->shutdown_started = Clock::now();
    s->http->stop_accepting();
    LOG_INFO("shutdown: no longer accepting; waiting up to %d s for %zu running request(s)", s->opt.shutdown_grace_seconds, s->jobs.size());
  });
}

void ApiServer::run() {
  std::weak_ptr<State> weak = state_;
  state_->http->on_signal([this](int sig) {
    LOG_INFO("received %s", sig == SIGINT ? "SIGINT" : "SIGTERM");
    shutdown();
  });
  state_->http->every(std::chrono::milliseconds(100), [weak] {
    auto s = weak.lock();
    if (!s) return;
    send_keepalives(*s);
    if (!s->shutting_down) return;
    double waited = std::chrono::duration<double>(Clock::now() - s->shutdown_started).count();
    if (s->jobs.empty() && s->pending == 0) {
      LOG_INFO("shutdown: all requests finished; stopping");
      s->http->stop();
    } else if (!s->cancelled_for_shutdown && waited >= s->opt.shutdown_grace_seconds) {
      LOG_WARN("shutdown: grace period over; cancelling %zu request(s)", s->jobs.size());
      cancel_all_jobs(*s);
      s->cancelled_for_shutdown = true;
    } else if (waited >= s->opt.shutdown_grace_seconds + 10) {
      LOG_WARN("shutdown: %zu request(s) did not finish after cancel; closing connections", s->jobs.size());
      s->jobs.clear();
      s->http->stop();
    }
  });
  state_->http->run();
}

}  // namespace muse::server
