// The API server over real loopback sockets with the fake model: every bad
// input of server-api.md §3.3 gets its status and envelope; SSE framing;
// disconnects cancel; keep-alive; graceful shutdown.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "muse/core/json.h"
#include "muse/server/api_server.h"

using namespace muse;
using namespace muse::server;

#include "../support/fake_model/fake_model.h"
#include "../support/loopback_client.h"
#include "hardening_support.h"

namespace {

using hardening::Reply;

int connect_to(int port) { return muse::test_support::connect_loopback(port, 10); }
using muse::test_support::send_all;


// One request on its own connection, read until the server closes (10 s receive timeout).
Reply raw(int port, const std::string& request) { return hardening::raw(port, request, 10); }

Reply request(int port, const std::string& method, const std::string& path, const std::string& body = "",
              const std::string& extra_headers = "") {
  return raw(port, method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n" +
                       extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
}

class ServerFixture : public ::testing::Test {
 protected:
  void start(ApiServerOptions o = {}, FakeModelOptions fo = {}, bool load = true) {
    o.http.host = "127.0.0.1";
    o.http.port = 0;
    o.http.max_body_bytes = 1 << 20;
    o.served_model_names = {"muse-test", "alias"};
    o.log_requests = false;
    fo.max_model_len = 512;
    fo.step_ms = 0.5;
    backend_ = make_fake_backend(fo);
    server_ = std::make_unique<ApiServer>(o, backend_);
    ASSERT_TRUE(server_->listen().ok());
    port_ = server_->port();
    thread_ = std::thread([this] { server_->run(); });
    if (load) {
      ASSERT_TRUE(backend_.service->load(nullptr).ok());
      server_->set_ready();
    }
  }
  void TearDown() override {
    if (server_) {
      server_->shutdown();
      thread_.join();
      backend_.service.reset();
      server_.reset();
    }
  }
  ServeBackend backend_;
  std::unique_ptr<ApiServer> server_;
  std::thread thread_;
  int port_ = 0;
};

using hardening::error_code;
using hardening::json_of;

}  // namespace

TEST_F(ServerFixture, ErrorTable) {
  start();
  const std::string chat = "/v1/chat/completions";
  struct Case {
    std::string path, body;
    int status;
    std::string code;
  };
  const Case cases[] = {
      {chat, "{\"messages\":", 400, "invalid_json"},
      {chat, "not json", 400, "invalid_json"},
      {chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xC3\x28\"}]}", 400, "invalid_encoding"},
      {chat, R"({"messages":"hello"})", 400, "invalid_type"},
      {chat, R"({"messages":[{"role":"user","content":"hi"}],"temperature":"warm"})", 400, "invalid_type"},
      {chat, R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":-1})", 400, "invalid_value"},
      {chat, R"({"messages":[{"role":"user","content":"hi"}],"n":100000})", 400, "invalid_value"},
      {chat, R"({"messages":[{"role":"user","content":"hi"}],"top_logprobs":1000,"logprobs":true})", 400, "invalid_value"},
      {chat, R"({"model":"nope","messages":[{"role":"user","content":"hi"}]})", 404, "model_not_found"},
      {chat, R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":100000})", 400, "context_length_exceeded"},
      {chat, R"({"messages":[{"role":"user","content":")" + std::string(600, 'x') + R"("}]})", 400, "context_length_exceeded"},
      {chat, R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})", 400, "unsupported_value"},
      {chat, R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"raise_exception":"bad template input"}})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt":[1,2,99999]})", 400, "invalid_value"},
      {"/v1/nope", "{}", 404, "not_found"},
  };
  for (const auto& c : cases) {
    Reply r = request(port_, "POST", c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.body << "\n" << r.body;
    EXPECT_EQ(error_code(r), c.code) << c.body << "\n" << r.body;
    Json j = json_of(r);
    ASSERT_TRUE(j.find("error")) << r.body;
    EXPECT_TRUE(j.find("error")->find("message")->is_string());
    EXPECT_TRUE(j.find("error")->find("type")->is_string());
    EXPECT_TRUE(j.find("error")->contains("param"));
  }
  // The model error lists what is served.
  Reply r = request(port_, "POST", chat, R"({"model":"nope","messages":[{"role":"user","content":"hi"}]})");
  EXPECT_NE(r.body.find("muse-test, alias"), std::string::npos);
  // Anthropic envelope on /v1/messages.
  r = request(port_, "POST", "/v1/messages", R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json_of(r).get_string("type", ""), "error");
  EXPECT_EQ(json_of(r).find("error")->get_string("type", ""), "invalid_request_error");
  // Wrong method.
  r = request(port_, "GET", chat);
  EXPECT_EQ(r.status, 405);
}

TEST_F(ServerFixture, BodyLimit) {
  start();
  // Declared too large: refused before the body is read.
  Reply r = raw(port_, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n");
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(error_code(r), "request_too_large");
  // Actually too large, chunked.
  std::string chunk(512 * 1024, 'a');
  std::string req = "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; ++i) req += "80000\r\n" + chunk + "\r\n";
  req += "0\r\n\r\n";
  r = raw(port_, req);
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(json_of(r).find("error")->get_string("type", ""), "request_too_large");
  // Malformed HTTP.
  r = raw(port_, "GARBAGE\r\n\r\n");
  EXPECT_EQ(r.status, 400);
}

TEST_F(ServerFixture, ApiKeyAndHealth) {
  ApiServerOptions o;
  o.api_key = "sekret";
  start(o);
  EXPECT_EQ(request(port_, "GET", "/health").status, 200);  // health stays open
  for (const char* path : {"/v1/models", "/version"}) {  // /metrics is open (issue 17)
    Reply r = request(port_, "GET", path);
    EXPECT_EQ(r.status, 401) << path;
    EXPECT_EQ(error_code(r), "invalid_api_key");
  }
  EXPECT_EQ(request(port_, "POST", "/tokenize", R"({"prompt":"a"})", "Authorization: Bearer wrong\r\n").status, 401);
  EXPECT_EQ(request(port_, "POST", "/tokenize", R"({"prompt":"a"})", "Authorization: Bearer sekret\r\n").status, 200);
  EXPECT_EQ(request(port_, "GET", "/v1/models", "", "x-api-key: sekret\r\n").status, 200);
  Reply r = request(port_, "POST", "/v1/messages", "{}", "x-api-key: nope\r\n");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(json_of(r).find("error")->get_string("type", ""), "authentication_error");
}

TEST_F(ServerFixture, HealthIs503WhileLoading) {
  start({}, {}, /*load=*/false);
  EXPECT_EQ(request(port_, "GET", "/health").status, 503);
  EXPECT_EQ(request(port_, "POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})").status, 503);
  ASSERT_TRUE(backend_.service->load(nullptr).ok());
  server_->set_ready();
  EXPECT_EQ(request(port_, "GET", "/health").status, 200);
}

TEST_F(ServerFixture, CorsOffByDefaultOnWhenConfigured) {
  start();
  Reply r = request(port_, "GET", "/v1/models", "", "Origin: http://evil.example\r\n");
  EXPECT_EQ(r.head.find("Access-Control-Allow-Origin"), std::string::npos);
  EXPECT_EQ(request(port_, "OPTIONS", "/v1/models", "", "Origin: http://evil.example\r\n").status, 405);
}

TEST_F(ServerFixture, CorsAllowed) {
  ApiServerOptions o;
  o.allowed_origins = {"http://ok.example"};
  start(o);
  Reply r = request(port_, "OPTIONS", "/v1/chat/completions", "",
                    "Origin: http://ok.example\r\nAccess-Control-Request-Method: POST\r\n");
  EXPECT_EQ(r.status, 204);
  EXPECT_NE(r.head.find("Access-Control-Allow-Origin: http://ok.example"), std::string::npos);
  r = request(port_, "GET", "/v1/models", "", "Origin: http://other.example\r\n");
  EXPECT_EQ(r.head.find("Access-Control-Allow-Origin"), std::string::npos);
}

TEST_F(ServerFixture, StreamingFramingAndUsage) {
  start();
  Reply r = request(port_, "POST", "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"echo: hello"}],"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.head.find("Content-Type: text/event-stream"), std::string::npos);
  // Every event is one "data: " line and a blank line; the last is [DONE].
  std::string content, reasoning;
  int usage_chunks = 0;
  size_t pos = 0;
  std::string last;
  while (pos < r.body.size()) {
    size_t end = r.body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    std::string ev = r.body.substr(pos, end - pos);
    pos = end + 2;
    ASSERT_TRUE(ev.starts_with("data: ")) << ev;
    last = ev.substr(6);
    if (last == "[DONE]") continue;
    Json j = *Json::parse(last);
    if (j.find("choices")->as_array().empty()) {
      ++usage_chunks;
      EXPECT_GT(j.find("usage")->get_int("completion_tokens", 0), 0);
      continue;
    }
    const Json& delta = *j.find("choices")->as_array()[0].find("delta");
    content += delta.get_string("content", "");
    reasoning += delta.get_string("reasoning", "");
    EXPECT_TRUE(j.find("usage")->is_null());
  }
  EXPECT_EQ(last, "[DONE]");
  EXPECT_EQ(usage_chunks, 1);
  EXPECT_EQ(content, "hello");
  EXPECT_EQ(reasoning, "The user said: echo: hello.");
}

TEST_F(ServerFixture, KeepAliveConnectionServesTwoRequests) {
  start();
  int fd = connect_to(port_);
  std::string body = R"({"prompt":"echo: x","max_tokens":3})";
  std::string one = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  send_all(fd, one + one);  // pipelined
  std::string all;
  char buf[8192];
  while (all.find("HTTP/1.1 200", all.find("HTTP/1.1 200") + 1) == std::string::npos || !all.ends_with("}")) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    all.append(buf, size_t(n));
  }
  close(fd);
  EXPECT_NE(all.find("HTTP/1.1 200", all.find("HTTP/1.1 200") + 1), std::string::npos) << all;
}

TEST_F(ServerFixture, DisconnectCancelsAndServerStillAnswers) {
  start();
  // A long generation; the client hangs up after the first bytes.
  for (int i = 0; i < 5; ++i) {
    int fd = connect_to(port_);
    std::string body = R"({"messages":[{"role":"user","content":"sleep:200 go"}],"stream":true,"max_tokens":400,"ignore_eos":true})";
    send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    char buf[256];
    (void)recv(fd, buf, sizeof buf, 0);
    close(fd);
  }
  // Within a few steps, the engine has nothing running.
  bool idle = false;
  for (int i = 0; i < 200 && !idle; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    idle = backend_.service->stats().num_requests_running == 0 && backend_.service->stats().num_requests_waiting == 0;
  }
  EXPECT_TRUE(idle);
  Reply m = request(port_, "GET", "/metrics");
  EXPECT_NE(m.body.find("muse:http_requests_client_disconnected_total{model_name=\"muse-test\"} 5"), std::string::npos) << m.body;
  EXPECT_EQ(request(port_, "GET", "/health").status, 200);
}

TEST_F(ServerFixture, KeepAliveCommentsDuringLongPrefill) {
  ApiServerOptions o;
  o.sse_keepalive_seconds = 0.2;
  start(o);
  Reply r = request(port_, "POST", "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"sleep:700 then talk"}],"stream":true,"max_tokens":5})");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find(": keep-alive\n\n"), std::string::npos) << r.body;
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n"));
}

TEST_F(ServerFixture, EngineErrorAfterHeadersIsAnErrorFrame) {
  start();
  Reply r = request(port_, "POST", "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"error:engine"}],"stream":true})");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("data: {\"error\":"), std::string::npos) << r.body;
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n"));
  r = request(port_, "POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"error:engine"}]})");
  EXPECT_EQ(r.status, 500);
}

TEST_F(ServerFixture, TokenizeDetokenizeModelsVersion) {
  start();
  Reply r = request(port_, "POST", "/tokenize", R"({"prompt":"ab","add_special_tokens":false})");
  EXPECT_EQ(json_of(r).get_int("count", -1), 2);
  r = request(port_, "POST", "/detokenize", R"({"tokens":[104,105]})");
  EXPECT_EQ(json_of(r).get_string("prompt", ""), "hi");
  EXPECT_EQ(request(port_, "POST", "/detokenize", R"({"tokens":[-1]})").status, 400);
  r = request(port_, "GET", "/v1/models");
  EXPECT_EQ(json_of(r).find("data")->as_array().size(), 2u);
  EXPECT_EQ(request(port_, "GET", "/v1/models/alias").status, 200);
  EXPECT_EQ(request(port_, "GET", "/v1/models/x").status, 404);
  EXPECT_EQ(request(port_, "GET", "/version").status, 200);
  r = request(port_, "POST", "/v1/messages/count_tokens", R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_GT(json_of(r).get_int("input_tokens", 0), 0);
}

TEST_F(ServerFixture, GreedyIsDeterministicAndSeedsRepeat) {
  start();
  auto content = [&](const std::string& extra) {
    Reply r = request(port_, "POST", "/v1/chat/completions",
                      R"({"messages":[{"role":"user","content":"tell me"}],"max_tokens":60)" + extra + "}");
    return json_of(r).find("choices")->as_array()[0].find("message")->get_string("content", "");
  };
  EXPECT_EQ(content(R"(,"temperature":0)"), content(R"(,"temperature":0)"));
  EXPECT_EQ(content(R"(,"temperature":1,"seed":5)"), content(R"(,"temperature":1,"seed":5)"));
}

TEST_F(ServerFixture, GracefulShutdownLetsRunningRequestsFinish) {
  start();
  Reply got;
  std::thread client([&] {
    got = request(port_, "POST", "/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"sleep:300 hi"}],"max_tokens":20})");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server_->shutdown();
  client.join();
  EXPECT_EQ(got.status, 200) << got.body;
  thread_.join();
  backend_.service.reset();
  server_.reset();
}

TEST_F(ServerFixture, FullQueueIs429WithRetryAfter) {
  FakeModelOptions fo;
  fo.max_num_seqs = 1;
  fo.max_waiting = 1;
  start({}, fo);
  // One runs (slowly), one waits: the others are refused.
  std::vector<Reply> replies(4);
  std::vector<std::thread> clients;
  for (auto& reply : replies)
    clients.emplace_back([&] {
      reply = request(port_, "POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"sleep:400 x"}],"max_tokens":2})");
    });
  for (auto& c : clients) c.join();
  Reply r;
  int ok = 0;
  for (const auto& reply : replies) {
    if (reply.status == 429) r = reply;
    ok += reply.status == 200;
  }
  EXPECT_GE(ok, 1);
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(error_code(r), "server_overloaded");
  EXPECT_NE(r.head.find("Retry-After: 1"), std::string::npos);
}
