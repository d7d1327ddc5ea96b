// The only file that includes Boost.Beast/Asio (they cost ~40 s to compile).
#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without it under C++20

#include "muse/server/http_server.h"

#include <sys/resource.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <deque>
#include <optional>
#include <unordered_map>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include "muse/core/log.h"

namespace muse::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

const std::string* HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

namespace {

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return out;
}

// Header values we emit never carry CR/LF (no response splitting).
std::string header_safe(std::string_view v) {
  std::string out;
  for (char c : v)
    if (c != '\r' && c != '\n') out.push_back(c);
  return out;
}

std::string status_line(int status) {
  auto reason = http::obsolete_reason(http::int_to_status(unsigned(status)));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.data(), reason.size()) + "\r\n";
}

using RequestParser = http::request_parser<http::string_body>;

void configure(RequestParser& p, const HttpServerOptions& o) {
  p.header_limit(uint32_t(std::min<size_t>(o.max_header_bytes, UINT32_MAX)));
  p.body_limit(o.max_body_bytes);
}

std::string path_of(beast::string_view target) {
  return std::string(target.substr(0, target.find('?')));
}

// The status a read error deserves; 0: just close (the peer went away).
int status_for(error_code ec) {
  if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
      ec == net::error::connection_reset || ec == http::error::partial_message)
    return 0;
  if (ec == http::error::body_limit) return 413;
  if (ec == http::error::header_limit) return 431;
  if (ec == http::error::bad_transfer_encoding) return 501;
  if (ec.category() == http::make_error_code(http::error::bad_target).category()) return 400;
  return 0;
}

// The first transfer coding other than chunked, or "" (RFC 9112 §6.1: a
// server that does not understand a coding answers 501).
std::string unsupported_coding(beast::string_view te) {
  std::string_view v(te.data(), te.size());
  while (!v.empty()) {
    size_t comma = v.find(',');
    std::string_view item = v.substr(0, comma);
    item = item.substr(0, item.find(';'));
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (!item.empty() && lowercase(item) != "chunked") return std::string(item);
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
  return "";
}

HttpRequest build_request(RequestParser& parser, const std::string& path) {
  auto& msg = parser.get();
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  req.version = int(msg.version());
  req.path = path;
  for (const auto& f : msg)
    req.headers.emplace_back(lowercase(std::string_view(f.name_string().data(), f.name_string().size())), std::string(f.value()));
  req.body = std::move(msg.body());
  return req;
}

class Connection;

class Exchange : public HttpExchange {
 public:
  Exchange(std::weak_ptr<Connection> conn, HttpRequest req) : conn_(std::move(conn)), req_(std::move(req)) {}
  const HttpRequest& request() const override { return req_; }
  void respond(HttpResponse response) override;
  void start_stream(int status, std::string content_type, HttpHeaders headers) override;
  void write(std::string data) override;
  void end_stream() override;
  bool closed() const override { return closed_; }
  void on_close(std::function<void()> fn) override { on_close_ = std::move(fn); }
  size_t queued_bytes() const override;
  bool finished() const override { return closed_ || state_ == State::Done; }

  // From the connection: the peer (or the server) closed it early.
  void mark_closed() {
    if (closed_) return;
    closed_ = true;
    if (state_ != State::Done && on_close_) {
      auto fn = std::move(on_close_);
      fn();
    }
  }

 private:
  enum class State { Open, Streaming, Done };
  std::weak_ptr<Connection> conn_;
  HttpRequest req_;
  State state_ = State::Open;
  bool closed_ = false;
  std::function<void()> on_close_;
};

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpServerOptions opt;
  HttpHandler handler;
  HttpErrorRenderer errors;
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  net::signal_set signals{io};
  std::function<void(int)> signal_fn;
  std::vector<std::unique_ptr<net::steady_timer>> timers;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;
  std::atomic<size_t> connection_count{0};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  uint64_t next_request_id = 0;
  bool accepting = false;
  bool stopped = false;
  HttpHeadFilter head_filter;
  std::atomic<size_t> buffered{0};  // request bytes held by all connections (I/O thread writes)
  // accept() errors (EMFILE at the descriptor limit): retried after a
  // growing pause, logged once per interval with a count.
  net::steady_timer accept_timer{io};
  int accept_backoff_ms = 0;
  uint64_t accept_errors = 0;
  std::chrono::steady_clock::time_point accept_error_logged{};

  void accept();
  void on_accept_error(error_code ec);
  void apply_descriptor_limit();
  void wait_signal() {
    signals.async_wait([self = shared_from_this()](error_code ec, int sig) {
      if (ec) return;
      self->signal_fn(sig);
      self->wait_signal();
    });
  }
  void schedule(net::steady_timer* t, std::chrono::milliseconds period, std::shared_ptr<std::function<void()>> fn);
  void close_all();
};

namespace {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<HttpServer::Impl> srv, tcp::socket s)
      : srv_(std::move(srv)), sock_(std::move(s)), timer_(srv_->io) {
    error_code ec;
    auto ep = sock_.remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
    sock_.set_option(tcp::no_delay(true), ec);  // SSE chunks must not wait for Nagle
  }

  void start() { read_header(); }

  // Queues bytes; flushes in order. Drops a client that lets a stream pile
  // up; a whole response (`whole`) is exempt: it exists already, and the
  // socket's flow control paces its delivery.
  void send(std::string bytes, bool whole = false) {
    if (closed_ || bytes.empty()) return;
    queued_ += bytes.size();
    out_.push_back(std::move(bytes));
    if (!whole && queued_ > srv_->opt.max_queued_bytes) {
      LOG_WARN("http: dropping %s: %zu bytes queued (client not reading)", remote_.c_str(), queued_);
      close();
      return;
    }
    flush();
  }

  // The current response has been fully queued.
  void response_done(bool keep_alive) {
    response_done_ = true;
    keep_alive_ = keep_alive_ && keep_alive;
    after_flush();
  }

  size_t queued() const { return queued_; }
  bool keep_alive() const { return keep_alive_; }
  bool http10() const { return http10_; }

  void close() {
    if (closed_) return;
    closed_ = true;
    release_budget();
    error_code ec;
    timer_.cancel();
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    out_.clear();
    queued_ = 0;
    if (auto ex = exchange_) {
      exchange_.reset();
      ex->mark_closed();
    }
    srv_->connections.erase(this);
    srv_->connection_count = srv_->connections.size();
  }

 private:
  // Idle keep-alive connections just close; a request that started but did
  // not arrive in full within the limit (a body shorter than its
  // Content-Length, a slow header) is answered 408 first.
  void arm_idle_timer() {
    timer_.expires_after(std::chrono::seconds(srv_->opt.idle_timeout_seconds));
    timer_.async_wait([self = shared_from_this(), gen = ++timer_gen_](error_code ec) {
      if (ec || gen != self->timer_gen_ || self->exchange_ || self->closed_) return;
      bool started = self->parser_ && (self->parser_->got_some() || self->buf_.size() > 0);
      if (!started) return self->close();
      self->timed_out_ = true;
      error_code ignored;
      self->sock_.cancel(ignored);  // the pending read completes as aborted and is ignored
      self->protocol_error(408, self->path_, "Request timeout: the request did not arrive in full within " +
                                                 std::to_string(self->srv_->opt.idle_timeout_seconds) + " s.");
    });
  }

  void read_header() {
    if (closed_) return;
    parser_.emplace();
    configure(*parser_, srv_->opt);
    response_done_ = false;
    path_.clear();
    arm_idle_timer();
    http::async_read_header(sock_, buf_, *parser_, [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(error_code ec) {
    if (closed_ || timed_out_) return;
    auto& req = parser_->get();
    // The target is known once the request line is parsed, even when the
    // headers then fail (a too-large Content-Length fails here already).
    path_ = path_of(req.target());
    const std::string& path = path_;
    if (ec) return on_read_error(ec, path);
    http10_ = req.version() < 11;
    if (req.version() >= 11 && req.find(http::field::host) == req.end())
      return protocol_error(400, path, "Malformed HTTP request: HTTP/1.1 requires a Host header.");
    if (std::string coding = unsupported_coding(req[http::field::transfer_encoding]); !coding.empty())
      return protocol_error(501, path, "Transfer-Encoding '" + coding + "' is not supported (only chunked).");
    if (auto len = parser_->content_length(); len && *len > srv_->opt.max_body_bytes)
      return protocol_error(413, path, "Request body of " + std::to_string(*len) + " bytes exceeds the limit of " +
                                           std::to_string(srv_->opt.max_body_bytes) + " bytes.");
    if (srv_->head_filter) {
      HttpRequest head = build_request(*parser_, path);
      head.remote = remote_;
      if (auto early = srv_->head_filter(head)) return answer_and_close(std::move(*early));
    }
    // The body is read only within the server-wide budget; a declared length
    // is reserved whole, a chunked body as it grows.
    if (auto len = parser_->content_length(); len && !reserve(size_t(*len))) return over_budget();
    auto expect = req[http::field::expect];
    if (!expect.empty() && lowercase(std::string_view(expect.data(), expect.size())) == "100-continue")
      send("HTTP/1.1 100 Continue\r\n\r\n");
    read_body();
  }

  void read_body() {
    if (parser_->is_done()) return on_body({});
    http::async_read_some(sock_, buf_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      if (self->closed_ || self->timed_out_) return;
      if (ec) return self->on_read_error(ec, self->path_);
      if (!self->reserve(self->parser_->get().body().size())) return self->over_budget();
      self->read_body();
    });
  }

  // Grows this connection's share of the budget to `bytes` (never shrinks).
  bool reserve(size_t bytes) {
    if (bytes <= reserved_) return true;
    size_t extra = bytes - reserved_;
    if (srv_->buffered.load() + extra > srv_->opt.max_buffered_bytes) return false;
    srv_->buffered += extra;
    reserved_ = bytes;
    return true;
  }

  void release_budget() {
    srv_->buffered -= std::min(reserved_, srv_->buffered.load());
    reserved_ = 0;
  }

  void over_budget() {
    LOG_WARN("http: %s: request buffer budget of %zu bytes is in use; answering 503", remote_.c_str(), srv_->opt.max_buffered_bytes);
    protocol_error(503, path_, "The server is holding its limit of " + std::to_string(srv_->opt.max_buffered_bytes >> 20) +
                                   " MiB of request bodies; retry shortly.");
  }

  void on_body(error_code ec) {
    const std::string path = path_;
    if (closed_) return;
    if (ec) return on_read_error(ec, path);
    timer_.cancel();
    keep_alive_ = parser_->get().keep_alive();
    HttpRequest req = build_request(*parser_, path);
    req.remote = remote_;
    req.id = ++srv_->next_request_id;
    head_only_ = req.method == "HEAD";
    parser_.reset();
    exchange_ = std::make_shared<Exchange>(weak_from_this(), std::move(req));
    watch();
    auto ex = exchange_;
    srv_->handler(ex);
  }

  void on_read_error(error_code ec, const std::string& path) {
    switch (status_for(ec)) {
      case 413: return protocol_error(413, path, "Request body exceeds the limit of " + std::to_string(srv_->opt.max_body_bytes) + " bytes.");
      case 431: return protocol_error(431, path, "Request headers exceed the limit of " + std::to_string(srv_->opt.max_header_bytes) + " bytes.");
      case 400: return protocol_error(400, path, "Malformed HTTP request: " + ec.message() + ".");
      case 501: return protocol_error(501, path, "This Transfer-Encoding is not supported (only chunked).");
      default: return close();
    }
  }

  // An error before a handler saw the request: answer and close.
  void protocol_error(int status, const std::string& path, std::string message) {
    answer_and_close(srv_->errors(status, path, std::move(message)));
  }

  void answer_and_close(HttpResponse r) {
    std::string head = status_line(r.status) + "Content-Type: " + header_safe(r.content_type) + "\r\nContent-Length: " +
                       std::to_string(r.body.size()) + "\r\nConnection: close\r\n";
    for (const auto& [k, v] : r.headers) head += header_safe(k) + ": " + header_safe(v) + "\r\n";
    keep_alive_ = false;
    send(head + "\r\n" + r.body, /*whole=*/true);
    response_done(false);
  }

  // While a request is handled, keep one read pending so that EOF/RST from
  // the client is noticed at once. Bytes that arrive (a pipelined request)
  // stay in buf_ for the next read_header().
  void watch() {
    if (closed_ || watching_) return;
    if (buf_.size() > srv_->opt.max_header_bytes) return;  // enough pipelined data: stop reading
    watching_ = true;
    sock_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
      self->watching_ = false;
      self->buf_.commit(n);
      if (self->closed_) return;
      if (self->lingering_) {
        if (ec) return self->close();
        self->buf_.consume(self->buf_.size());
        return self->drain_input();
      }
      if (ec && ec != net::error::operation_aborted) {
        self->close();  // the client went away
        return;
      }
      if (self->resume_after_watch_) {
        self->resume_after_watch_ = false;
        self->read_header();
        return;
      }
      if (!ec) self->watch();
    });
  }

  void flush() {
    if (writing_ || closed_ || out_.empty()) return;
    writing_ = true;
    // Coalesce everything queued into one write.
    auto batch = std::make_shared<std::vector<std::string>>();
    while (!out_.empty()) {
      batch->push_back(std::move(out_.front()));
      out_.pop_front();
    }
    std::vector<net::const_buffer> bufs;
    for (const auto& s : *batch) bufs.emplace_back(s.data(), s.size());
    net::async_write(sock_, bufs, [self = shared_from_this(), batch](error_code ec, size_t n) {
      self->writing_ = false;
      if (self->closed_) return;
      if (ec) {
        self->close();
        return;
      }
      self->queued_ -= std::min(self->queued_, n);
      if (!self->out_.empty()) self->flush();
      else self->after_flush();
    });
  }

  // Closing right after an early answer (413 while the client is still
  // sending) would reset the connection and lose the answer: half-close, read
  // and discard what still comes for a moment, then close.
  void linger_then_close() {
    if (closed_ || lingering_) return;
    lingering_ = true;
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    timer_.expires_after(std::chrono::seconds(2));
    timer_.async_wait([self = shared_from_this(), gen = ++timer_gen_](error_code ec) {
      if (!ec && gen == self->timer_gen_) self->close();
    });
    if (!watching_) drain_input();  // else the pending watch read continues into drain_input()
  }

  void drain_input() {
    auto scratch = std::make_shared<std::array<char, 16384>>();
    sock_.async_read_some(net::buffer(*scratch), [self = shared_from_this(), scratch](error_code ec, size_t) {
      if (ec || self->closed_) return self->close();
      self->drain_input();
    });
  }

  void after_flush() {
    if (!response_done_ || writing_ || !out_.empty() || closed_) return;
    exchange_.reset();
    release_budget();  // the body was held while the request was handled
    response_done_ = false;
    if (!keep_alive_ || srv_->stopped) {
      linger_then_close();
      return;
    }
    if (watching_) {
      resume_after_watch_ = true;
      error_code ec;
      sock_.cancel(ec);
    } else {
      read_header();
    }
  }

  std::shared_ptr<HttpServer::Impl> srv_;
  tcp::socket sock_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  net::steady_timer timer_;
  uint64_t timer_gen_ = 0;
  std::shared_ptr<Exchange> exchange_;
  std::deque<std::string> out_;
  size_t queued_ = 0;
  std::string remote_;
  std::string path_;      // of the request being read
  size_t reserved_ = 0;   // this connection's share of srv_->buffered
  bool writing_ = false, watching_ = false, resume_after_watch_ = false;
  bool response_done_ = false, keep_alive_ = true, closed_ = false, lingering_ = false;
  bool timed_out_ = false, http10_ = false;

 public:
  bool head_only_ = false;
};

void Exchange::respond(HttpResponse r) {
  auto conn = conn_.lock();
  if (closed_ || state_ != State::Open || !conn) return;
  state_ = State::Done;
  std::string out = status_line(r.status);
  if (!r.content_type.empty()) out += "Content-Type: " + header_safe(r.content_type) + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += conn->keep_alive() ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : r.headers) out += header_safe(k) + ": " + header_safe(v) + "\r\n";
  out += "\r\n";
  if (!conn->head_only_) out += r.body;
  conn->send(std::move(out), /*whole=*/true);
  conn->response_done(true);
}

// HTTP/1.0 has no chunked encoding: the stream is the raw body, ended by
// closing the connection.
void Exchange::start_stream(int status, std::string content_type, HttpHeaders headers) {
  auto conn = conn_.lock();
  if (closed_ || state_ != State::Open || !conn) return;
  state_ = State::Streaming;
  std::string out = status_line(status) + "Content-Type: " + header_safe(content_type) + "\r\n" +
                    (conn->http10() ? "" : "Transfer-Encoding: chunked\r\n") + "Cache-Control: no-cache\r\n";
  out += conn->keep_alive() && !conn->http10() ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : headers) out += header_safe(k) + ": " + header_safe(v) + "\r\n";
  conn->send(out + "\r\n");
}

void Exchange::write(std::string data) {
  auto conn = conn_.lock();
  if (closed_ || state_ != State::Streaming || !conn || data.empty()) return;
  if (conn->http10()) return conn->send(std::move(data));
  char size[20];
  int len = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  data.insert(0, size, size_t(len));
  data += "\r\n";
  conn->send(std::move(data));
}

void Exchange::end_stream() {
  auto conn = conn_.lock();
  if (closed_ || state_ != State::Streaming || !conn) return;
  state_ = State::Done;
  if (conn->http10()) return conn->response_done(false);
  conn->send("0\r\n\r\n");
  conn->response_done(true);
}

size_t Exchange::queued_bytes() const {
  auto conn = conn_.lock();
  return conn ? conn->queued() : 0;
}

}  // namespace

std::optional<HttpRequest> parse_http_request(std::string_view bytes, const HttpServerOptions& options, int* status) {
  RequestParser parser;
  configure(parser, options);
  *status = 0;
  error_code ec;
  size_t used = 0;
  while (!parser.is_done()) {
    size_t n = parser.put(net::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == http::error::need_more) {
      if (n == 0) return std::nullopt;  // no progress: the request is incomplete
      ec = {};
      continue;
    }
    if (ec) {
      *status = status_for(ec);
      return std::nullopt;
    }
    if (parser.is_header_done() && !parser.is_done()) {
      auto& head = parser.get();
      if (head.version() >= 11 && head.find(http::field::host) == head.end()) {
        *status = 400;
        return std::nullopt;
      }
      if (!unsupported_coding(head[http::field::transfer_encoding]).empty()) {
        *status = 501;
        return std::nullopt;
      }
      if (auto len = parser.content_length(); len && *len > options.max_body_bytes) {
        *status = 413;
        return std::nullopt;
      }
      if (used == bytes.size()) return std::nullopt;
    }
  }
  return build_request(parser, path_of(parser.get().target()));
}

void HttpServer::Impl::accept() {
  if (!accepting) return;
  acceptor.async_accept([self = shared_from_this()](error_code ec, tcp::socket s) {
    if (!self->accepting) return;
    if (ec) return self->on_accept_error(ec);
    self->accept_backoff_ms = 0;
    auto conn = std::make_shared<Connection>(self, std::move(s));
    self->connections[conn.get()] = conn;
    self->connection_count = self->connections.size();
    if (int(self->connections.size()) > self->opt.max_connections) {
      HttpResponse r = self->errors(503, "", "Too many open connections.");
      conn->send(status_line(503) + "Content-Type: " + r.content_type + "\r\nContent-Length: " + std::to_string(r.body.size()) +
                 "\r\nConnection: close\r\n\r\n" + r.body, /*whole=*/true);
      conn->response_done(false);
    } else {
      conn->start();
    }
    self->accept();
  });
}

// accept() fails while the process is out of descriptors (EMFILE/ENFILE) or
// buffers; retrying at once would spin a core and flood the log. Retry after
// a pause that doubles up to 1 s, and log once per 10 s with a count.
void HttpServer::Impl::on_accept_error(error_code ec) {
  if (ec == net::error::operation_aborted) return;
  ++accept_errors;
  auto now = std::chrono::steady_clock::now();
  if (accept_error_logged == std::chrono::steady_clock::time_point{} || now - accept_error_logged >= std::chrono::seconds(10)) {
    LOG_WARN("http: accept failed: %s (%llu time(s) since the last report; %zu connections open); retrying with back-off",
             ec.message().c_str(), static_cast<unsigned long long>(accept_errors), connections.size());
    accept_errors = 0;
    accept_error_logged = now;
  }
  accept_backoff_ms = std::min(1000, std::max(10, accept_backoff_ms * 2));
  accept_timer.expires_after(std::chrono::milliseconds(accept_backoff_ms));
  accept_timer.async_wait([self = shared_from_this()](error_code ec) {
    if (!ec) self->accept();
  });
}

// Every connection is a descriptor: the soft RLIMIT_NOFILE is raised to the
// hard one where allowed, and max_connections kept below it (with room for
// the model files, logs and the connections answered 503 on their way out).
void HttpServer::Impl::apply_descriptor_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  if (lim.rlim_cur == RLIM_INFINITY) return;
  const int64_t soft = int64_t(std::min<rlim_t>(lim.rlim_cur, rlim_t(1) << 30));
  const int64_t cap = std::max<int64_t>(1, soft - std::max<int64_t>(64, soft / 8));
  if (opt.max_connections > cap) {
    LOG_WARN("http: max connections lowered from %d to %lld by the open-file limit (%lld descriptors; raise it with ulimit -n)",
             opt.max_connections, static_cast<long long>(cap), static_cast<long long>(soft));
    opt.max_connections = int(cap);
  }
}

void HttpServer::Impl::schedule(net::steady_timer* t, std::chrono::milliseconds period, std::shared_ptr<std::function<void()>> fn) {
  t->expires_after(period);
  t->async_wait([self = shared_from_this(), t, period, fn](error_code ec) {
    if (ec || self->stopped) return;
    (*fn)();
    self->schedule(t, period, fn);
  });
}

void HttpServer::Impl::close_all() {
  std::vector<std::shared_ptr<Connection>> all;
  for (auto& [p, w] : connections)
    if (auto c = w.lock()) all.push_back(c);
  for (auto& c : all) c->close();
  connections.clear();
  connection_count = 0;
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler, HttpErrorRenderer errors)
    : impl_(std::make_shared<Impl>()) {
  impl_->opt = std::move(options);
  impl_->handler = std::move(handler);
  impl_->errors = std::move(errors);
}

HttpServer::~HttpServer() {
  if (impl_) {
    impl_->stopped = true;
    impl_->accepting = false;
    error_code ec;
    impl_->acceptor.close(ec);
    impl_->close_all();
    impl_->timers.clear();
  }
}

Status HttpServer::listen() {
  impl_->apply_descriptor_limit();
  error_code ec;
  auto addr = net::ip::make_address(impl_->opt.host == "localhost" ? "127.0.0.1" : impl_->opt.host, ec);
  if (ec) return make_error("--host: '" + impl_->opt.host + "' is not an IP address (" + ec.message() + ")");
  tcp::endpoint ep(addr, uint16_t(impl_->opt.port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return make_error("cannot listen on " + impl_->opt.host + ":" + std::to_string(impl_->opt.port) + ": " + ec.message());
  impl_->accepting = true;
  impl_->accept();
  return Status::Ok();
}

int HttpServer::port() const {
  error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? -1 : ep.port();
}

void HttpServer::run() {
  impl_->work.emplace(impl_->io.get_executor());
  if (impl_->signal_fn) {
    impl_->signals.add(SIGINT);
    impl_->signals.add(SIGTERM);
    impl_->wait_signal();
  }
  // The last line of defence: a handler that throws (the API layer catches
  // what it can) is logged and the loop goes on serving everyone else.
  for (;;) {
    try {
      impl_->io.run();
      return;
    } catch (const std::exception& e) {
      LOG_ERROR("http: an I/O handler threw (%s); continuing", e.what());
    } catch (...) {
      LOG_ERROR("http: an I/O handler threw an unknown exception; continuing");
    }
  }
}

void HttpServer::post(std::function<void()> fn) { net::post(impl_->io, std::move(fn)); }

void HttpServer::every(std::chrono::milliseconds period, std::function<void()> fn) {
  impl_->timers.push_back(std::make_unique<net::steady_timer>(impl_->io));
  impl_->schedule(impl_->timers.back().get(), period, std::make_shared<std::function<void()>>(std::move(fn)));
}

void HttpServer::on_signal(std::function<void(int)> fn) { impl_->signal_fn = std::move(fn); }
void HttpServer::on_head(HttpHeadFilter filter) { impl_->head_filter = std::move(filter); }
int HttpServer::max_connections() const { return impl_->opt.max_connections; }
size_t HttpServer::buffered_bytes() const { return impl_->buffered.load(); }

void HttpServer::stop_accepting() {
  net::post(impl_->io, [self = impl_] {
    self->accepting = false;
    error_code ec;
    self->acceptor.close(ec);
  });
}

void HttpServer::stop() {
  net::post(impl_->io, [self = impl_] {
    self->stopped = true;
    self->accepting = false;
    error_code ec;
    self->acceptor.close(ec);
    self->signals.cancel(ec);
    self->accept_timer.cancel();
    for (auto& t : self->timers) t->cancel();
    self->close_all();
    self->work.reset();
  });
}

size_t HttpServer::open_connections() const { return impl_->connection_count.load(); }

}  // namespace muse::server
