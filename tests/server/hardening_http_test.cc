// Issue 17, the HTTP side: the key before the body, a server-wide budget for
// buffered request bytes, large whole responses delivered, and HTTP
// conformance (HTTP/1.0 streams, 408, 501, Host). Loopback only; every wait
// is bounded.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>
#include <vector>

#include "hardening_support.h"

namespace muse::server {
namespace {

using hardening::RealServer;
using hardening::Reply;
using hardening::error_code;
using hardening::json_of;
using hardening::parse_reply;
using hardening::request;
using muse::test_support::connect_loopback;
using muse::test_support::send_all;

// Resident memory of this process (the server runs in it), in MiB.
double rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

// Reads what arrives within `ms` (or until the peer closes).
std::string read_for(int fd, int ms) {
  timeval tv{0, 50 * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string all;
  char buf[65536];
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n > 0) all.append(buf, size_t(n));
  }
  return all;
}

// Item 2: a keyless client is refused from its headers: no 100 Continue, no
// body buffered, and twenty of them holding 8 MiB bodies cost no memory.
TEST_F(RealServer, KeyIsCheckedBeforeAnyBodyIsRead) {
  ApiServerOptions o;
  o.api_key = "sekret";
  o.http.max_body_bytes = 64u << 20;
  start(o);
  int fd = connect_loopback(port_, 5);
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
               "Content-Length: 60000000\r\n\r\n");
  std::string got = read_for(fd, 2000);
  close(fd);
  EXPECT_TRUE(got.starts_with("HTTP/1.1 401")) << got.substr(0, 200);
  EXPECT_EQ(got.find("100 Continue"), std::string::npos);

  const double before = rss_mib();
  const std::string chunk(1 << 20, ' ');
  std::vector<int> fds;
  for (int i = 0; i < 20; ++i) {
    int c = connect_loopback(port_, 5);
    ASSERT_GE(c, 0);
    send_all(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 8388608\r\n\r\n");
    fds.push_back(c);
  }
  for (int round = 0; round < 8; ++round)
    for (int c : fds) {
      // The server answered and half-closed; what it still reads is discarded.
      timeval tv{0, 200 * 1000};
      setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      (void)::send(c, chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double grown = rss_mib() - before;
  for (int c : fds) close(c);
  EXPECT_LT(grown, 48.0) << "keyless bodies must not be buffered (20 x 8 MiB sent)";
  Reply m = request(port_, "GET", "/metrics");
  EXPECT_NE(m.body.find(R"(http_requests_total{handler="/v1/completions",method="POST",status="4xx"})"), std::string::npos)
      << "early refusals are still counted";
  EXPECT_EQ(request(port_, "GET", "/health").status, 200);
}

// Item 2: routes that take no body refuse one from the head (the open
// routes, /health and /metrics, cannot be used to buffer bytes either).
TEST_F(RealServer, BodylessRoutesRefuseABodyFromTheHead) {
  ApiServerOptions o;
  o.api_key = "sekret";
  start(o);
  for (const char* path : {"/health", "/metrics", "/v1/models", "/nope"}) {
    const char* want = std::string_view(path) == "/nope" ? "HTTP/1.1 404" : "HTTP/1.1 413";
    int fd = connect_loopback(port_, 5);
    send_all(fd, std::string("POST ") + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 20000000\r\nExpect: 100-continue\r\n\r\n");
    std::string got = read_for(fd, 1500);
    close(fd);
    EXPECT_TRUE(got.starts_with(want)) << path << ": " << got.substr(0, 120);
  }
  EXPECT_EQ(request(port_, "GET", "/health").status, 200);
}

// Item 2: the server-wide budget for buffered request bytes.
TEST_F(RealServer, BufferedRequestBytesHaveAGlobalBudget) {
  ApiServerOptions o;
  o.http.max_buffered_bytes = 3u << 20;
  o.http.max_body_bytes = 8u << 20;
  start(o);
  auto head = [](size_t len) {
    return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(len) +
           "\r\n\r\n";
  };
  // Two slow uploads of 1.25 MiB each hold 2.5 MiB; a third does not fit.
  std::vector<int> slow;
  for (int i = 0; i < 2; ++i) {
    int c = connect_loopback(port_, 5);
    send_all(c, head(1310720) + "{\"prompt\":\"");
    slow.push_back(c);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Reply r = hardening::raw(port_, head(1u << 20) + std::string(1u << 20, ' '));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(error_code(r), "server_overloaded");
  EXPECT_NE(r.head.find("Retry-After"), std::string::npos);
  // Chunked bodies are counted as they grow.
  std::string chunked = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 4; ++i) chunked += "40000\r\n" + std::string(0x40000, ' ') + "\r\n";
  r = hardening::raw(port_, chunked + "0\r\n\r\n");
  EXPECT_EQ(r.status, 503) << r.body;
  // Small requests still fit; released budget is reusable.
  EXPECT_EQ(request(port_, "POST", "/tokenize", R"({"prompt":"a"})").status, 200);
  for (int c : slow) close(c);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::string body = R"({"prompt":"hi","max_tokens":1,"user":")" + std::string(1u << 20, 'u') + "\"}";
  r = request(port_, "POST", "/v1/completions", body);
  EXPECT_EQ(r.status, 200) << r.body.substr(0, 300);
}

// Item 5: a whole response far over the per-connection queue limit (which
// is for streams) is delivered, and counted once as a success.
TEST_F(RealServer, LargeWholeResponsesAreDelivered) {
  ApiServerOptions o;
  o.http.max_queued_bytes = 256u << 10;
  start(o);
  Reply r = request(port_, "POST", "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"Count."}],"n":8,"max_tokens":80,"ignore_eos":true,)"
                    R"("logprobs":true,"top_logprobs":20,"temperature":1,"seed":3})");
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 300);
  EXPECT_GT(r.body.size(), size_t(512u << 10));
  Json j = json_of(r);
  ASSERT_TRUE(j.find("choices"));
  EXPECT_EQ(j.find("choices")->size(), 8u);
  Reply m = request(port_, "GET", "/metrics");
  EXPECT_NE(m.body.find(R"(muse:request_success_total{model_name="muse-tiny",finished_reason="length"} 1)"), std::string::npos) << m.body;
}

// Item 5: a response that could not be held whole is refused up front,
// naming the limit (streaming it is the way).
TEST_F(RealServer, ImpossiblyLargeWholeResponsesAreRefusedUpFront) {
  ApiServerOptions o;
  o.max_response_bytes = 1u << 20;
  start(o);
  Reply r = request(port_, "POST", "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"hi"}],"n":8,"max_tokens":400,"logprobs":true,"top_logprobs":20})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(json_of(r).find("error")->get_string("message", "").find("1 MiB"), std::string::npos) << r.body;
  r = request(port_, "POST", "/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"hi"}],"n":8,"max_tokens":4,"logprobs":true,"top_logprobs":20,"stream":true})");
  EXPECT_EQ(r.status, 200) << "the same request streamed is fine";
}

// Item 4: parsing, rendering and tokenizing run off the I/O thread, and a
// prompt that cannot fit is refused before it is tokenized: /health stays
// fast and other requests keep being served while huge ones are handled.
TEST_F(RealServer, OneLargeRequestFreezesNoOne) {
  ApiServerOptions o;
  o.http.max_body_bytes = 64u << 20;
  start(o);
  std::string ids = "[1";
  ids.reserve(8u << 20);
  while (ids.size() < (8u << 20)) ids += ",1";
  ids += "]";
  const std::string big_ids = R"({"prompt":)" + ids + R"(,"max_tokens":1})";
  const std::string big_text = R"({"messages":[{"role":"user","content":")" + std::string(12u << 20, 'a') + R"("}]})";
  std::vector<Reply> big(4);
  std::vector<double> big_s(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i)
    clients.emplace_back([&, i] {
      auto t0 = std::chrono::steady_clock::now();
      big[size_t(i)] = i % 2 ? request(port_, "POST", "/v1/chat/completions", big_text) : request(port_, "POST", "/v1/completions", big_ids);
      big_s[size_t(i)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  double worst_health = 0;
  int small_ok = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (int i = 0; i < 60 && std::chrono::steady_clock::now() < until; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(request(port_, "GET", "/health").status, 200);
    worst_health = std::max(worst_health, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (i % 10 == 0) small_ok += request(port_, "POST", "/v1/completions", R"({"prompt":"hi","max_tokens":1})").status == 200;
  }
  for (auto& c : clients) c.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(big[size_t(i)].status, 400) << big[size_t(i)].body.substr(0, 200);
    EXPECT_EQ(error_code(big[size_t(i)]), "context_length_exceeded") << big[size_t(i)].body.substr(0, 300);
    EXPECT_LT(big_s[size_t(i)], 20.0);
  }
  EXPECT_LT(worst_health, 0.75) << "/health waited on request parsing";
  EXPECT_GE(small_ok, 1);
}

// Item 7: HTTP conformance.
TEST_F(RealServer, Http10StreamsWithoutChunkedEncoding) {
  start();
  std::string body = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true})";
  Reply r = hardening::raw(port_, "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " +
                                      std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.head.find("Transfer-Encoding"), std::string::npos) << r.head;
  EXPECT_NE(r.head.find("Connection: close"), std::string::npos);
  EXPECT_TRUE(r.body.starts_with("data: ")) << r.body.substr(0, 100);
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n"));
}

TEST_F(RealServer, ShortBodyIs408AfterTheTimeout) {
  ApiServerOptions o;
  o.http.idle_timeout_seconds = 1;
  start(o);
  auto t0 = std::chrono::steady_clock::now();
  Reply r = hardening::raw(port_, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  "Content-Length: 100\r\n\r\n{\"prompt\":", 10);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 408) << r.head;
  EXPECT_EQ(error_code(r), "request_timeout");
  EXPECT_LT(s, 5.0);
  r = hardening::raw(port_, "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow:", 10);  // a header that never ends
  EXPECT_EQ(r.status, 408);
  EXPECT_EQ(request(port_, "GET", "/health").status, 200);
}

TEST_F(RealServer, UnsupportedTransferCodingIs501AndHostIsRequired) {
  start();
  for (const char* te : {"gzip", "gzip, chunked", "deflate", "chunked, identity", "x-custom"}) {
    Reply r = hardening::raw(port_, std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                                "Transfer-Encoding: ") + te + "\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    EXPECT_EQ(r.status, 501) << te << " " << r.head;
  }
  Reply r = hardening::raw(port_, "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(json_of(r).find("error")->get_string("message", "").find("Host"), std::string::npos);
  r = hardening::raw(port_, "GET /health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.status, 200) << "HTTP/1.0 needs no Host";
}

}  // namespace
}  // namespace muse::server
