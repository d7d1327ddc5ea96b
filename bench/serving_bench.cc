// Serving benchmark: time to first token, inter-token latency and throughput
// at several concurrency levels against `muse serve` (started here, or a
// running one with --url), plus the share of the engine's step time spent
// outside the model's forward pass (from /metrics: muse:engine_busy_seconds_total
// and muse:engine_model_seconds_total).
//
// Each client sends streaming /v1/completions requests back to back (a fixed
// prompt per client, greedy, ignore_eos, exactly --max-tokens tokens), so
// every request decodes the same number of tokens and each SSE chunk is one
// engine step's token.
//
//   muse_serving_bench --muse build/muse [--concurrency 1,4,16,64] [--requests 4]
//                      [--max-tokens 64] [--prompt-words 48] [--runs 3] [-- SERVER_FLAGS...]
//   muse_serving_bench --url http://127.0.0.1:8000 ...
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../tests/support/loopback_client.h"
#include "../tests/support/spawn_server.h"

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One request; `on_data` sees each received piece with its arrival time.
template <class F>
bool http(int port, const std::string& method, const std::string& path, const std::string& body, F on_data) {
  return muse::test_support::http_exchange(port, 600, method, path, body, [&](std::string_view d) {
    on_data(d, Clock::now());
    return true;
  });
}

std::string get(int port, const std::string& path) {
  std::string out;
  http(port, "GET", path, "", [&](std::string_view d, Clock::time_point) { out.append(d); });
  return out;
}

double metric(const std::string& metrics, const std::string& name) {
  size_t at = metrics.find("\n" + name + "{");
  if (at == std::string::npos) return 0;
  size_t sp = metrics.find("} ", at);
  return sp == std::string::npos ? 0 : std::atof(metrics.c_str() + sp + 2);
}

struct RequestTiming {
  double ttft = 0, e2e = 0;
  std::vector<double> gaps;  // between token-carrying chunks
  int tokens = 0;
  bool ok = false;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

std::string body_for(int client, int words, int max_tokens) {
  static const char* kWords[] = {"river", "stone", "light", "music", "garden", "winter", "city", "ocean", "paper", "forest"};
  std::string prompt = "Story " + std::to_string(client) + ":";
  for (int i = 0; i < words; ++i) prompt += std::string(" ") + kWords[(client * 7 + i * 3) % 10];
  return R"({"prompt":")" + prompt + R"(","max_tokens":)" + std::to_string(max_tokens) +
         R"(,"temperature":0,"ignore_eos":true,"stream":true})";
}

RequestTiming one_request(int port, const std::string& body) {
  RequestTiming t;
  const auto start = Clock::now();
  std::optional<Clock::time_point> last;
  std::string pending;
  bool done = false;
  http(port, "POST", "/v1/completions", body, [&](std::string_view d, Clock::time_point now) {
    pending.append(d);
    // Count SSE events carrying text; a read may hold several.
    size_t pos;
    while ((pos = pending.find("\n\n")) != std::string::npos) {
      std::string_view ev(pending.data(), pos);
      if (ev.find("data: [DONE]") != std::string::npos) done = true;
      else if (ev.find("\"text\":\"") != std::string::npos && ev.find("\"text\":\"\"") == std::string::npos) {
        ++t.tokens;
        if (!last) t.ttft = secs(now - start);
        else t.gaps.push_back(secs(now - *last));
        last = now;
      }
      pending.erase(0, pos + 2);
    }
  });
  t.e2e = secs(Clock::now() - start);
  t.ok = done;
  return t;
}

struct Level {
  int concurrency = 0;
  double wall = 0, tokens = 0;
  std::vector<double> ttft, tpot, itl;
  double busy = 0, model = 0, steps = 0;
  int failed = 0;
};

Level run_level(int port, int concurrency, int requests, int words, int max_tokens) {
  Level L;
  L.concurrency = concurrency;
  std::mutex mu;
  const std::string before = get(port, "/metrics");
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&, c] {
      for (int r = 0; r < requests; ++r) {
        RequestTiming t = one_request(port, body_for(c * 131 + r, words, max_tokens));
        std::lock_guard lock(mu);
        if (!t.ok) {
          ++L.failed;
          continue;
        }
        L.tokens += t.tokens;
        L.ttft.push_back(t.ttft);
        if (t.tokens > 1) L.tpot.push_back((t.e2e - t.ttft) / double(t.tokens - 1));
        L.itl.insert(L.itl.end(), t.gaps.begin(), t.gaps.end());
      }
    });
  }
  for (auto& t : threads) t.join();
  L.wall = secs(Clock::now() - t0);
  const std::string after = get(port, "/metrics");
  L.busy = metric(after, "muse:engine_busy_seconds_total") - metric(before, "muse:engine_busy_seconds_total");
  L.model = metric(after, "muse:engine_model_seconds_total") - metric(before, "muse:engine_model_seconds_total");
  L.steps = metric(after, "muse:engine_steps_total") - metric(before, "muse:engine_steps_total");
  return L;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < s.size()) {
    out.push_back(std::atoi(s.c_str() + pos));
    pos = s.find(',', pos);
    if (pos == std::string::npos) break;
    ++pos;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string muse, url;
  std::vector<int> levels = {1, 4, 16, 64};
  int requests = 4, max_tokens = 64, words = 48, runs = 3;
  std::vector<std::string> server_flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (++i; i < argc; ++i) server_flags.push_back(argv[i]);
      break;
    }
    if (i + 1 >= argc) return std::fprintf(stderr, "%s needs a value\n", a.c_str()), 2;
    std::string v = argv[++i];
    if (a == "--muse") muse = v;
    else if (a == "--url") url = v;
    else if (a == "--concurrency") levels = parse_list(v);
    else if (a == "--requests") requests = std::atoi(v.c_str());
    else if (a == "--max-tokens") max_tokens = std::atoi(v.c_str());
    else if (a == "--prompt-words") words = std::atoi(v.c_str());
    else if (a == "--runs") runs = std::atoi(v.c_str());
    else return std::fprintf(stderr, "unknown flag %s\n", a.c_str()), 2;
  }
  if (muse.empty() == url.empty())
    return std::fprintf(stderr, "usage: muse_serving_bench (--muse PATH | --url http://127.0.0.1:PORT) [--concurrency 1,4,16,64] "
                                "[--requests N] [--max-tokens N] [--prompt-words N] [--runs N] [-- SERVER_FLAGS...]\n"), 2;
  signal(SIGPIPE, SIG_IGN);
  int port = -1;
  pid_t pid = -1;
  if (!url.empty()) {
    size_t colon = url.rfind(':');
    port = colon == std::string::npos ? -1 : std::atoi(url.c_str() + colon + 1);
  } else {
    std::vector<std::string> flags = {"--disable-log-requests"};
    flags.insert(flags.end(), server_flags.begin(), server_flags.end());
    const auto server = muse::test_support::spawn_muse_serve(muse, flags);
    if (server.stderr_fd < 0) return 1;
    pid = server.pid;
    const int log_fd = server.stderr_fd;
    std::string log;
    char buf[4096];
    while (port < 0) {
      ssize_t n = read(log_fd, buf, sizeof buf);
      if (n <= 0) break;
      log.append(buf, size_t(n));
      size_t at = log.find("ready: http://127.0.0.1:");
      if (at != std::string::npos) port = std::atoi(log.c_str() + at + 24);
    }
    if (port < 0) return std::fprintf(stderr, "server did not start:\n%s\n", log.c_str()), 1;
    std::thread([fd = log_fd] {
      char b[4096];
      while (read(fd, b, sizeof b) > 0) {}
    }).detach();
  }
  if (port <= 0) return std::fprintf(stderr, "bad --url\n"), 2;
  // Warm up (page in the weights, first-touch buffers).
  one_request(port, body_for(999, words, 8));

  std::printf("# %d requests per client, %d prompt words (~%d tokens), %d generated tokens each; median of %d runs\n",
              requests, words, words + 4, max_tokens, runs);
  // "ceiling": generated tokens per second of model time alone (the same
  // workload if HTTP, scheduling, sampling and idle gaps cost nothing).
  std::printf("%-5s %10s %10s %10s %10s %10s %10s %12s %8s %10s\n", "conc", "tok/s", "ceiling", "TTFT p50", "TTFT p90",
              "TPOT p50", "ITL p90", "steps/s", "tok/step", "outside%");
  for (int c : levels) {
    std::vector<Level> rs;
    for (int r = 0; r < runs; ++r) rs.push_back(run_level(port, c, requests, words, max_tokens));
    std::sort(rs.begin(), rs.end(), [](const Level& a, const Level& b) { return a.tokens / a.wall < b.tokens / b.wall; });
    const Level& L = rs[rs.size() / 2];
    const double outside = L.busy > 0 ? 100.0 * (L.busy - L.model) / L.busy : 0;
    std::printf("%-5d %10.1f %10.1f %9.1fms %9.1fms %9.2fms %9.2fms %12.1f %8.1f %9.2f%%%s\n", c, L.tokens / L.wall,
                L.model > 0 ? L.tokens / L.model : 0.0, 1e3 * percentile(L.ttft, 0.5), 1e3 * percentile(L.ttft, 0.9), 1e3 * percentile(L.tpot, 0.5),
                1e3 * percentile(L.itl, 0.9), L.steps / L.wall, L.steps > 0 ? L.tokens / L.steps : 0, outside,
                L.failed ? " (FAILED REQUESTS)" : "");
    std::fflush(stdout);
  }
  if (pid > 0) {
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
  }
  return 0;
}
