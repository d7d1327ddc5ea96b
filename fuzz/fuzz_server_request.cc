// Whole requests through the real server: HTTP parsing, routing, the key and
// media-type checks, validation, rendering with the embedded model's chat
// template and tokenizer (models/muse-tiny), admission, the response parser
// and the writers, over a loopback socket. The engine is a stand-in that
// answers at once with ids taken from the prompt (so the parser sees the
// model's own framing tokens in fuzzer-chosen orders) and logprobs when
// asked. A crash, a sanitizer report, a 5xx for a deterministic input, or a
// request left unanswered (hang) is a finding.
//
// Input: byte 0 picks the endpoint (low 3 bits) and the framing (bit 3:
// HTTP/1.0; bit 4: chunked body; bit 5: an Expect: 100-continue header);
// the rest is the body.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "muse/core/log.h"
#include "muse/engine/default_model.h"
#include "muse/server/api_server.h"
#include "muse/server/backend_factory.h"

#include "../tests/support/loopback_client.h"

using namespace muse;
using namespace muse::server;

namespace {

// Answers every request at once, from the submitting thread, with up to 12
// of the prompt's last ids per choice (their text from the real tokenizer).
class InstantEngine : public GenerationService {
 public:
  explicit InstantEngine(std::shared_ptr<ModelAdapter> adapter) : adapter_(std::move(adapter)) {}
  Status load(const LoadProgressFn&) override { return Status::Ok(); }
  std::optional<SubmitError> submit(GenerationRequest r, std::shared_ptr<GenerationSink> sink) override {
    if (r.prompt.empty()) return SubmitError{SubmitError::Kind::Invalid, "empty prompt"};
    const size_t take = std::min<size_t>(12, size_t(std::max<int64_t>(1, r.max_tokens)));
    GenerationSummary summary;
    summary.prompt_tokens = int(r.prompt.size());
    for (int c = 0; c < r.n; ++c) {
      GenerationOutput out;
      out.index = c;
      size_t from = r.prompt.size() > take ? r.prompt.size() - take : 0;
      out.token_ids.assign(r.prompt.begin() + long(from), r.prompt.end());
      auto text = adapter_->detokenize(out.token_ids, r.skip_special_tokens);
      out.text = text.ok() ? *text : "";
      if (r.logprobs >= 0)
        for (int32_t id : out.token_ids) {
          TokenLogprob lp{id, "t", -0.5, {}};
          for (int k = 0; k < r.logprobs; ++k) lp.top.push_back({int32_t(k), "x", -1.0 - k});
          out.logprobs.push_back(std::move(lp));
        }
      if (r.prompt_logprobs >= 0)
        for (int32_t id : r.prompt) out.prompt_logprobs.push_back({id, "p", -1.0, {}});
      out.finish = (r.prompt.size() + size_t(c)) % 3 == 0 ? FinishReason::Length : FinishReason::Stop;
      if (out.finish == FinishReason::Stop && !r.stop_strings.empty()) out.stop_string = r.stop_strings[0];
      summary.completion_tokens.push_back(int(out.token_ids.size()));
      sink->on_output(std::move(out));
    }
    sink->on_complete(std::move(summary));
    return std::nullopt;
  }
  void cancel(const std::string&) override {}
  EngineStats stats() const override { return {}; }

 private:
  std::shared_ptr<ModelAdapter> adapter_;
};

struct Server {
  std::unique_ptr<ApiServer> api;
  std::thread thread;
  int port = 0;
};

Server* start_server() {
  // Quiet; FUZZ_LOG_INFO (debugging the harness only) shows every request.
  set_log_level(std::getenv("FUZZ_LOG_INFO") ? LogLevel::Info : LogLevel::Error);
  auto dir = default_model_dir();
  if (!dir.ok()) {
    std::fprintf(stderr, "fuzz_server_request: %s\n", dir.message().c_str());
    std::abort();
  }
  EngineServeOptions e;
  e.model = *dir;
  e.max_model_len = 512;
  auto backend = make_engine_backend(e);
  if (!backend.ok()) {
    std::fprintf(stderr, "fuzz_server_request: %s\n", backend.message().c_str());
    std::abort();
  }
  ServeBackend b = std::move(backend).value();
  b.service = std::make_shared<InstantEngine>(b.adapter);
  ApiServerOptions o;
  o.http.host = "127.0.0.1";
  o.http.port = 0;
  o.http.max_body_bytes = 1 << 20;
  o.served_model_names = {"muse-tiny"};
  o.log_requests = false;
  auto* s = new Server;  // lives for the whole run
  s->api = std::make_unique<ApiServer>(o, b);
  if (!s->api->listen().ok()) std::abort();
  s->port = s->api->port();
  s->api->set_ready();
  s->thread = std::thread([s] { s->api->run(); });
  return s;
}

const char* kPaths[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                        "/v1/responses", "/tokenize", "/detokenize", "/v1/chat/completions"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Server* server = start_server();
  if (size == 0) return 0;
  const uint8_t sel = data[0];
  std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool http10 = sel & 8, chunked = (sel & 16) && !http10, expect = sel & 32;
  std::string req = std::string("POST ") + kPaths[sel & 7] + (http10 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\nHost: fuzz\r\n") +
                    "Content-Type: application/json\r\nConnection: close\r\n" + (expect ? "Expect: 100-continue\r\n" : "");
  if (chunked) {
    char len[32];
    std::snprintf(len, sizeof len, "%zx", body.size());
    req += "Transfer-Encoding: chunked\r\n\r\n";
    if (!body.empty()) req += std::string(len) + "\r\n" + std::string(body) + "\r\n";
    req += "0\r\n\r\n";
  } else {
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
  }

  // libFuzzer's SIGALRM (its -timeout watchdog) interrupts blocking calls:
  // EINTR is retried, and the 10 s deadline is measured by the clock.
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) fd = muse::test_support::connect_loopback(server->port, 1);
  if (fd < 0) std::abort();  // the server is gone
  for (size_t off = 0; off < req.size();) {
    ssize_t n = ::send(fd, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server may answer (413, 401) and close before reading everything
    off += size_t(n);
  }
  std::string reply;
  char buf[65536];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0 && (errno == EINTR || errno == EAGAIN) && std::chrono::steady_clock::now() < deadline) continue;
    if (n < 0 && errno == ECONNRESET) break;
    if (n < 0) {
      std::fprintf(stderr, "fuzz_server_request: no complete answer within 10 s (%zu bytes so far)\n", reply.size());
      if (std::getenv("FUZZ_STOP_ON_HANG")) {  // debugging: per-thread CPU over 2 s, then stop for a debugger
        for (int round = 0; round < 2; ++round) {
          char cmd[160];
          std::snprintf(cmd, sizeof cmd, "for t in /proc/%d/task/*; do echo \"$t $(cut -d' ' -f14,15 $t/stat)\"; done >&2", int(getpid()));
          if (std::system(cmd) != 0) break;
          sleep(2);
        }
        raise(SIGSTOP);
      }
      std::abort();
    }
    reply.append(buf, size_t(n));
  }
  // Reset instead of TIME_WAIT: at a thousand requests a second the client
  // side would otherwise run out of ephemeral ports.
  linger hard{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
  close(fd);
  // Skip interim 100 Continue; the final status must exist and not be 5xx
  // (the stand-in engine never fails, so a 5xx is the server's own fault).
  size_t at = 0;
  while (reply.compare(at, 12, "HTTP/1.1 100") == 0) {
    size_t end = reply.find("\r\n\r\n", at);
    if (end == std::string::npos) break;
    at = end + 4;
  }
  if (reply.size() < at + 12 || reply.compare(at, 5, "HTTP/") != 0) {
    std::fprintf(stderr, "fuzz_server_request: no status line in the answer (%zu bytes)\n", reply.size());
    std::abort();
  }
  int status = std::atoi(reply.c_str() + at + 9);
  if (status < 200 || status >= 500) {
    std::fprintf(stderr, "fuzz_server_request: status %d\n%s\n", status, reply.substr(at, 2000).c_str());
    std::abort();
  }
  return 0;
}
