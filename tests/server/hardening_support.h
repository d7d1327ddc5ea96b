// Shared by the issue-17 tests: a loopback client that keeps the raw reply,
// and a fixture serving the embedded model (muse-tiny, the real engine)
// through an adapter that throws on purpose when a request asks for it.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "muse/core/json.h"
#include "muse/engine/default_model.h"
#include "muse/server/api_server.h"
#include "muse/server/backend_factory.h"

#include "../support/loopback_client.h"

namespace muse::server::hardening {

struct Reply {
  int status = 0;  // 0: no status line came back (the connection was dropped)
  std::string head, body;
};

using muse::test_support::dechunk;

inline Reply parse_reply(const std::string& all) {
  Reply r;
  size_t sep = all.find("\r\n\r\n");
  if (sep == std::string::npos || all.size() < 12) return r;
  r.status = std::stoi(all.substr(9, 3));
  r.head = all.substr(0, sep);
  r.body = all.substr(sep + 4);
  if (r.head.find("Transfer-Encoding: chunked") != std::string::npos) r.body = dechunk(r.body);
  return r;
}

// Sends `bytes`, reads until the server closes (or 20 s pass).
inline Reply raw(int port, const std::string& bytes, int timeout_s = 20) {
  int fd = muse::test_support::connect_loopback(port, timeout_s);
  if (fd < 0) return {};
  muse::test_support::send_all(fd, bytes);
  std::string all;
  char buf[65536];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    all.append(buf, size_t(n));
  }
  close(fd);
  return parse_reply(all);
}

inline Reply request(int port, const std::string& method, const std::string& path, const std::string& body = "",
                     const std::string& extra_headers = "", const std::string& content_type = "application/json") {
  return raw(port, method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: " + content_type +
                       "\r\n" + extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
}

inline Json json_of(const Reply& r) {
  auto j = Json::parse(r.body);
  return j.ok() ? *j : Json();
}

inline std::string error_code(const Reply& r) {
  Json j = json_of(r);
  const Json* e = j.find("error");
  return e && e->find("code") && e->find("code")->is_string() ? e->find("code")->as_string() : "";
}

// The real adapter, except that it throws where a test asks it to: "THROW in
// render" in a chat request, "THROW in tokenize" in a completions prompt, and
// a tool named throw_in_parser makes the response parser throw.
class ThrowingAdapter : public ModelAdapter {
 public:
  explicit ThrowingAdapter(std::shared_ptr<ModelAdapter> inner) : inner_(std::move(inner)) {}
  const ModelInfo& info() const override { return inner_->info(); }
  Result<std::vector<int32_t>> tokenize(std::string_view text, bool add_special_tokens) const override {
    if (text.find("THROW in tokenize") != std::string_view::npos) throw std::runtime_error("test: tokenize threw");
    return inner_->tokenize(text, add_special_tokens);
  }
  Result<std::string> detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    return inner_->detokenize(ids, skip_special_tokens);
  }
  Result<RenderedPrompt> render_chat(const Json& request, ChatApi api) const override {
    if (request.dump().find("THROW in render") != std::string::npos) throw std::runtime_error("test: render threw");
    return inner_->render_chat(request, api);
  }
  std::unique_ptr<OutputParser> make_output_parser(const ParserOptions& options) const override {
    if (options.tools.dump().find("throw_in_parser") != std::string::npos) return std::make_unique<Thrower>();
    return inner_->make_output_parser(options);
  }

 private:
  struct Thrower : OutputParser {
    void feed(std::span<const int32_t>, std::string_view, ParsedDelta&) override { throw std::logic_error("test: parser threw"); }
    void finish(FinishReason, ParsedDelta&) override { throw std::logic_error("test: parser threw"); }
  };
  std::shared_ptr<ModelAdapter> inner_;
};

class RealServer : public ::testing::Test {
 protected:
  // `service`: replaces the engine (the adapter stays the real one).
  void start(ApiServerOptions o = {}, std::shared_ptr<GenerationService> service = nullptr) {
    auto dir = default_model_dir();
    ASSERT_TRUE(dir.ok()) << "the embedded model is part of the repository";
    EngineServeOptions e;
    e.model = *dir;
    e.max_model_len = 512;
    e.max_num_seqs = 16;
    e.max_num_batched_tokens = 512;
    e.kv_cache_memory_bytes = 8 << 20;
    e.block_size = 16;
    auto b = make_engine_backend(e);
    ASSERT_TRUE(b.ok()) << b.message();
    backend_ = std::move(b).value();
    backend_.adapter = std::make_shared<ThrowingAdapter>(backend_.adapter);
    if (service) backend_.service = std::move(service);
    o.http.host = "127.0.0.1";
    o.http.port = 0;
    o.served_model_names = {"muse-tiny"};
    o.log_requests = false;
    server_ = std::make_unique<ApiServer>(o, backend_);
    ASSERT_TRUE(server_->listen().ok());
    port_ = server_->port();
    thread_ = std::thread([this] { server_->run(); });
    ASSERT_TRUE(backend_.service->load([](const LoadProgress&) {}).ok());
    server_->set_ready();
  }
  void TearDown() override {
    if (server_) {
      server_->shutdown();
      thread_.join();
      server_.reset();
      backend_.service.reset();
    }
  }
  // The engine has nothing running or waiting (within 10 s).
  bool wait_idle() {
    for (int i = 0; i < 1000; ++i) {
      EngineStats s = backend_.service->stats();
      if (s.num_requests_running == 0 && s.num_requests_waiting == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  ServeBackend backend_;
  std::unique_ptr<ApiServer> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace muse::server::hardening
