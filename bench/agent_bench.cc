// Multi-turn agent benchmark: what prefix caching saves an agent session.
//
// One conversation of --turns turns against `muse serve` (started here twice:
// with --enable-prefix-caching and with --no-enable-prefix-caching): a
// system prompt, two tool schemas, and a history that grows every turn by an
// assistant tool call, its tool result and a new user message (fixed texts,
// so both runs send identical requests). Each turn is one streaming
// /v1/chat/completions request (greedy, --max-tokens tokens); per turn it
// reports the prompt tokens, the cached tokens the server reports
// (usage.prompt_tokens_details.cached_tokens), the tokens actually prefilled,
// and the time to first token, for both servers; and the totals.
//
//   muse_agent_bench (or bench_agent_bench) --muse build/muse [--turns 10] [--max-tokens 8] [--repeat 3] [-- SERVER_FLAGS...]
//
// TTFT is the median over --repeat runs of the whole conversation (each run on
// a fresh server, so the cache starts empty).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "muse/core/json.h"

#include "../tests/support/loopback_client.h"
#include "../tests/support/spawn_server.h"

namespace {

using Clock = std::chrono::steady_clock;

const char* kSystem =
    "You are a coding agent working in a Linux shell on a C++ repository. Plan briefly, then act: call exactly one "
    "tool per step, read its result, and continue until the task is done. Prefer small, safe commands; never delete "
    "files you did not create; report what you changed in one sentence at the end.";

std::string tools_json() {
  return R"([{"type":"function","function":{"name":"run_shell","description":"Run a shell command in the repository and return its output.","parameters":{"type":"object","properties":{"command":{"type":"string","description":"the command line"},"timeout_s":{"type":"integer","description":"seconds before it is killed"}},"required":["command"]}}},)"
         R"({"type":"function","function":{"name":"read_file","description":"Read part of a file.","parameters":{"type":"object","properties":{"path":{"type":"string"},"first_line":{"type":"integer"},"last_line":{"type":"integer"}},"required":["path"]}}}])";
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

// The messages of turn t (0-based): system, the task, then per earlier turn
// an assistant tool call, its result and the user's next instruction.
std::string messages(int t) {
  std::string m = R"([{"role":"system","content":")" + esc(kSystem) + R"("},)";
  m += R"({"role":"user","content":"The build fails in src/kv. Find out why and fix it."})";
  for (int i = 0; i < t; ++i) {
    const std::string id = "call_" + std::to_string(i);
    const bool shell = i % 2 == 0;
    const std::string args = shell ? R"({\"command\":\"make -C build kv 2>&1 | tail -20 # step )" + std::to_string(i) + R"(\"})"
                                   : R"({\"path\":\"src/kv/cache.cc\",\"first_line\":)" + std::to_string(10 * i) +
                                         R"(,\"last_line\":)" + std::to_string(10 * i + 30) + "}";
    m += R"(,{"role":"assistant","content":"","tool_calls":[{"id":")" + id +
         R"(","type":"function","function":{"name":")" + (shell ? "run_shell" : "read_file") + R"(","arguments":")" +
         args + R"("}}]})";
    std::string result = shell ? "cache.cc:" + std::to_string(40 + i) +
                                     ": error: no member named 'blocks_for' in 'KvCache'; did you mean 'pages_for'?\n"
                                     "1 error generated. make: *** [kv] Error 1"
                               : "int64_t KvCache::pages_for(int64_t n) const {\n  return geo_.pages_for(n);\n}\n"
                                 "// line " + std::to_string(10 * i) + " to " + std::to_string(10 * i + 30);
    m += R"(,{"role":"tool","tool_call_id":")" + id + R"(","content":")" + esc(result) + R"("})";
    m += R"(,{"role":"user","content":"Keep going; step )" + std::to_string(i + 1) + R"( of the fix."})";
  }
  return m + "]";
}

struct Turn {
  int64_t prompt = 0, cached = 0;
  double ttft = 0;
  bool ok = false;
};

Turn one_turn(int port, int t, int max_tokens) {
  const std::string body = R"({"messages":)" + messages(t) + R"(,"tools":)" + tools_json() +
                           R"(,"stream":true,"temperature":0,"max_tokens":)" + std::to_string(max_tokens) +
                           R"(,"stream_options":{"include_usage":true}})";
  Turn r;
  std::string all;
  const auto t0 = Clock::now();
  bool first = false;
  muse::test_support::http_exchange(port, 600, "POST", "/v1/chat/completions", body, [&](std::string_view d) {
    // The first generated text (the role-only chunk comes before the prefill).
    if (!first && (d.find("\"content\":\"") != std::string_view::npos || d.find("\"reasoning") != std::string_view::npos ||
                   d.find("\"tool_calls\":[") != std::string_view::npos) &&
        d.find("\"content\":\"\"") == std::string_view::npos) {
      first = true;
      r.ttft = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    all.append(d);
    return true;
  });
  // The usage chunk: the last data event with "usage".
  size_t at = all.rfind("\"usage\":{");
  if (at == std::string::npos || all.find("data: [DONE]") == std::string::npos) return r;
  size_t start = all.rfind("data: {", at);
  size_t end = all.find("\n\n", at);
  auto j = muse::Json::parse(std::string_view(all).substr(start + 6, end - start - 6));
  if (!j.ok()) return r;
  const muse::Json* u = j->find("usage");
  if (!u) return r;
  r.prompt = u->get_int("prompt_tokens", 0);
  if (const muse::Json* d = u->find("prompt_tokens_details")) r.cached = d->get_int("cached_tokens", 0);
  r.ok = first;
  return r;
}

struct Server {
  pid_t pid = -1;
  int port = -1;
};

Server start(const std::string& muse, std::vector<std::string> flags) {
  Server s;
  flags.insert(flags.begin(), "--disable-log-requests");
  const auto sp = muse::test_support::spawn_muse_serve(muse, flags);
  if (sp.stderr_fd < 0) return s;
  s.pid = sp.pid;
  std::string log;
  char buf[4096];
  while (s.port < 0) {
    ssize_t n = read(sp.stderr_fd, buf, sizeof buf);
    if (n <= 0) break;
    log.append(buf, size_t(n));
    size_t at = log.find("ready: http://127.0.0.1:");
    if (at != std::string::npos) s.port = std::atoi(log.c_str() + at + 24);
  }
  if (s.port < 0) std::fprintf(stderr, "server did not start:\n%s\n", log.c_str());
  std::thread([fd = sp.stderr_fd] {
    char b[4096];
    while (read(fd, b, sizeof b) > 0) {}
  }).detach();
  return s;
}

void stop(Server& s) {
  if (s.pid <= 0) return;
  kill(s.pid, SIGTERM);
  int st = 0;
  waitpid(s.pid, &st, 0);
  s.pid = -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string muse;
  int turns = 10, max_tokens = 8, repeat = 3;
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
    else if (a == "--turns") turns = std::atoi(v.c_str());
    else if (a == "--max-tokens") max_tokens = std::atoi(v.c_str());
    else if (a == "--repeat") repeat = std::atoi(v.c_str());
    else return std::fprintf(stderr, "unknown flag %s\n", a.c_str()), 2;
  }
  if (muse.empty())
    return std::fprintf(stderr, "usage: bench_agent_bench --muse PATH [--turns N] [--max-tokens N] [--repeat N] "
                                "[-- SERVER_FLAGS...]\n"), 2;
  signal(SIGPIPE, SIG_IGN);

  // results[mode][run][turn]
  std::vector<std::vector<std::vector<Turn>>> results(2);
  for (int mode = 0; mode < 2; ++mode) {
    for (int run = 0; run < repeat; ++run) {
      std::vector<std::string> flags = server_flags;
      flags.push_back(mode == 0 ? "--enable-prefix-caching" : "--no-enable-prefix-caching");
      Server s = start(muse, flags);
      if (s.port < 0) return 1;
      std::vector<Turn> conv;
      for (int t = 0; t < turns; ++t) {
        conv.push_back(one_turn(s.port, t, max_tokens));
        if (!conv.back().ok) {
          std::fprintf(stderr, "turn %d failed (mode %d run %d)\n", t, mode, run);
          stop(s);
          return 1;
        }
      }
      stop(s);
      results[size_t(mode)].push_back(conv);
    }
  }
  std::printf("# %d turns, %d generated tokens per turn, TTFT median of %d runs (fresh server each run)\n", turns,
              max_tokens, repeat);
  std::printf("%-5s %8s %8s %10s %10s %12s %12s %8s\n", "turn", "prompt", "cached", "prefilled", "new", "TTFT cache",
              "TTFT none", "speedup");
  int64_t total_prompt = 0, total_cached = 0;
  double sum_c = 0, sum_n = 0;
  int64_t prev_prompt = 0;
  for (int t = 0; t < turns; ++t) {
    std::vector<double> tc, tn;
    for (int run = 0; run < repeat; ++run) {
      tc.push_back(results[0][size_t(run)][size_t(t)].ttft);
      tn.push_back(results[1][size_t(run)][size_t(t)].ttft);
    }
    const Turn& a = results[0][0][size_t(t)];
    const double mc = median(tc), mn = median(tn);
    std::printf("%-5d %8lld %8lld %10lld %10lld %10.1f ms %10.1f ms %7.2fx\n", t + 1, (long long)a.prompt,
                (long long)a.cached, (long long)(a.prompt - a.cached), (long long)(a.prompt - prev_prompt), mc * 1e3,
                mn * 1e3, mn / std::max(mc, 1e-9));
    prev_prompt = a.prompt;
    total_prompt += a.prompt, total_cached += a.cached, sum_c += mc, sum_n += mn;
    if (results[1][0][size_t(t)].cached != 0) std::printf("  (!) the run without the cache reported cached tokens\n");
  }
  std::printf("total %8lld %8lld %10lld %10s %10.1f ms %10.1f ms %7.2fx\n", (long long)total_prompt,
              (long long)total_cached, (long long)(total_prompt - total_cached), "", sum_c * 1e3, sum_n * 1e3,
              sum_n / std::max(sum_c, 1e-9));
  std::printf("prefill tokens saved: %lld of %lld (%.1f%%)\n", (long long)total_cached, (long long)total_prompt,
              100.0 * double(total_cached) / double(std::max<int64_t>(1, total_prompt)));
  return 0;
}
