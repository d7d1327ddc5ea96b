// HTTP/1.1 server on Boost.Beast/Asio (one event-loop thread; see
// docs/server.md for the choice). It knows nothing about OpenAI: it parses
// requests (Beast's parser, with header and body limits), hands each to a
// handler as an HttpExchange, writes plain or chunked (SSE) responses with a
// bounded per-connection queue, keeps connections alive, and watches the
// socket while a request is being handled so that a client disconnect is seen
// at once (HttpExchange::on_close), even before the first byte is written.
//
// Threading: run() drives everything on the calling thread. Every method of
// HttpExchange, and the handler, run on that thread; other threads hand work
// over with post(). Beast/Asio types stay inside http_server.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "muse/core/status.h"

namespace muse::server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path + query
  std::string path;    // without the query
  HttpHeaders headers; // names lowercased
  std::string body;
  std::string remote;  // "ip:port"
  uint64_t id = 0;     // connection-unique sequence number, for logs
  int version = 11;    // HTTP/1.1 = 11, HTTP/1.0 = 10 (1.0 peers get no chunked encoding)
  const std::string* header(std::string_view lowercase_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  HttpHeaders headers;
  std::string body;
};

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;
  // Exactly one of respond() or start_stream() ... end_stream().
  virtual void respond(HttpResponse response) = 0;
  virtual void start_stream(int status, std::string content_type, HttpHeaders headers) = 0;
  virtual void write(std::string data) = 0;  // one chunk; empty data is skipped
  virtual void end_stream() = 0;
  // The client went away (or the server dropped it: queue overflow, shutdown)
  // before the response was complete. Later calls are no-ops.
  virtual bool closed() const = 0;
  // Called once, on the I/O thread, when the exchange closes early.
  virtual void on_close(std::function<void()> fn) = 0;
  virtual size_t queued_bytes() const = 0;
  virtual bool finished() const = 0;  // response complete (or closed)
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;
// Renders protocol-level errors (malformed HTTP 400, body too large 413,
// headers too large 431) in the API's envelope. `path` may be empty.
using HttpErrorRenderer = std::function<HttpResponse(int status, std::string_view path, std::string message)>;
// Sees each request's head (body still empty) before any of the body is read
// or `100 Continue` is sent; a response it returns is sent instead and the
// connection closes (the body is never buffered). For authentication and
// other checks that need no body.
using HttpHeadFilter = std::function<std::optional<HttpResponse>(const HttpRequest& head)>;

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;                       // 0: any free port (see port())
  size_t max_body_bytes = 32u << 20;     // larger bodies get 413 before they are read
  size_t max_header_bytes = 64u << 10;
  // Per connection, for streamed responses: beyond it the client (not
  // reading) is dropped. A whole response is always delivered: it is built
  // already, and the socket's own flow control paces it.
  size_t max_queued_bytes = 16u << 20;
  // All connections together: request bytes buffered (bodies being read and
  // bodies of requests being handled). Beyond it a request gets 503.
  size_t max_buffered_bytes = 256u << 20;
  // More are answered 503 and closed. Capped at start by the descriptor
  // limit (RLIMIT_NOFILE, whose soft value is raised to the hard one).
  int max_connections = 16384;
  int idle_timeout_seconds = 60;         // keep-alive idle / slow request limit (then 408)
};

// Parses one complete request from `bytes` with the server's parser settings
// (the same limits and error mapping as a connection uses). On failure,
// `*status` is the HTTP status the server would answer (400, 413, 431), or 0
// when the bytes end before the request does. For tests and the fuzzer.
std::optional<HttpRequest> parse_http_request(std::string_view bytes, const HttpServerOptions& options, int* status);

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler, HttpErrorRenderer errors);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  Status listen();       // binds and starts accepting (not yet serving)
  int port() const;      // the bound port
  void run();            // serves until stop(); returns after every connection is closed
  // Thread-safe: runs fn on the I/O thread.
  void post(std::function<void()> fn);
  // I/O thread: calls fn every `period` until stop().
  void every(std::chrono::milliseconds period, std::function<void()> fn);
  // I/O thread: calls fn(signal number) on SIGINT/SIGTERM (installed by run()).
  void on_signal(std::function<void(int)> fn);
  void on_head(HttpHeadFilter filter);  // before listen()
  int max_connections() const;          // after listen(): the effective cap
  size_t buffered_bytes() const;        // request bytes held now (all connections)
  void stop_accepting();  // thread-safe
  void stop();            // thread-safe: closes all connections, run() returns
  size_t open_connections() const;

  struct Impl;  // defined in http_server.cc (keeps Asio out of this header)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace muse::server
