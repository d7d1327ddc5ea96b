// Load test for `muse serve`: N concurrent streaming chat requests on
// loopback, a random share of clients hanging up mid-stream. Checks that every
// surviving greedy stream ends with [DONE] and equals the same request run
// alone, that the engine ends idle, that the server still answers, and that it
// exits 0 on SIGTERM (under ASan/LSan a leak or error makes that fail).
//
//   server_load_test --muse build/muse_fake [--clients 256] [--disconnect 0.3] [--seed 1]
//                    [--max-tokens 64] [--shared-system-prompt] [-- SERVER_FLAGS...]
//   server_load_test --muse build/muse --real ...
//
// --muse names the server binary: by default `muse_fake` (`muse serve` over
// the fake model, tests/support/fake_model/); with --real, `muse` itself,
// serving the real engine on the embedded model (models/muse-tiny). Flags
// after `--` go to `serve` (e.g. a small KV cache so that sequences are
// preempted and recomputed under load).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "muse/core/json.h"

#include "../../support/loopback_client.h"
#include "../../support/spawn_server.h"

namespace {

std::string http(int port, const std::string& method, const std::string& path, const std::string& body,
                 size_t stop_after = 0) {
  std::string out;
  muse::test_support::http_exchange(port, 60, method, path, body, [&](std::string_view d) {
    out.append(d);
    return !(stop_after && out.size() >= stop_after);  // hang up mid-stream
  });
  return out;
}

// Concatenated reasoning, content and tool-call deltas of a chunked SSE chat
// stream; "" unless it ended with [DONE].
std::string stream_content(const std::string& response) {
  if (response.find("data: [DONE]") == std::string::npos) return "";
  std::string content;
  size_t pos = 0;
  while ((pos = response.find("data: {", pos)) != std::string::npos) {
    size_t end = response.find("\n\n", pos);
    if (end == std::string::npos) break;
    // SSE events never straddle a chunk here in practice, but be strict: a
    // chunk-size line inside an event would break JSON parsing below.
    auto j = muse::Json::parse(std::string_view(response).substr(pos + 6, end - pos - 6));
    pos = end;
    if (!j.ok()) return "<bad json>";
    const muse::Json* choices = j->find("choices");
    if (!choices || choices->as_array().empty()) continue;
    const muse::Json* delta = choices->as_array()[0].find("delta");
    if (!delta) continue;
    if (const muse::Json* r = delta->find("reasoning"); r && r->is_string()) content += "[r]" + r->as_string();
    if (const muse::Json* c = delta->find("content"); c && c->is_string()) content += c->as_string();
    if (const muse::Json* t = delta->find("tool_calls"); t && t->is_array())  // ids are random: compare the rest
      for (const auto& call : t->as_array()) {
        content += "[t" + std::to_string(call.get_int("index", -1)) + "]";
        if (const muse::Json* fn = call.find("function"))
          content += fn->get_string("name", "") + "|" + fn->get_string("arguments", "");
      }
    if (const muse::Json* f = choices->as_array()[0].find("finish_reason"); f && f->is_string()) content += "[f]" + f->as_string();
  }
  return content;
}

const char* kQuestions[] = {"What color is the sky?", "Hello!", "What's the weather in Paris?", "What is 2 plus 3?",
                            "Tell me a story.", "What is the capital of Japan?", "How many legs does a spider have?",
                            "What sound does a cow make?"};

int g_max_tokens = 64;
// --shared-system-prompt: every request starts with this system message (a
// hundred tokens with muse-tiny's tokenizer), so that the prefix cache shares its blocks.
bool g_shared_system = false;
const char* kSystem =
    "You are the assistant of a travel agency. Keep every answer short, friendly and factual, and name the city "
    "you talk about.";

std::string request_body(int prompt) {
  // Prompts 0-7: the questions; 8-11: four of them with a weather tool declared.
  std::string tools = prompt >= 8 ? R"(,"tools":[{"type":"function","function":{"name":"get_weather","description":"Get the current weather for a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])"
                                  : "";
  const std::string system = g_shared_system ? R"({"role":"system","content":")" + std::string(kSystem) + R"("},)" : "";
  return R"({"messages":[)" + system + R"({"role":"user","content":")" + std::string(kQuestions[prompt % 8]) + R"("}],"stream":true,"temperature":0,"max_tokens":)" +
         std::to_string(g_max_tokens) + R"(,"stream_options":{"include_usage":true})" + tools + "}";
}

}  // namespace

int main(int argc, char** argv) {
  std::string muse;
  int clients = 256, prompts = 12;
  double disconnect = 0.3;
  unsigned seed = 1;
  bool real = false;
  std::vector<std::string> server_flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (++i; i < argc; ++i) server_flags.push_back(argv[i]);
      break;
    }
    if (a == "--real") {
      real = true;
      continue;
    }
    if (a == "--shared-system-prompt") {
      g_shared_system = true;
      continue;
    }
    if (i + 1 >= argc) return std::fprintf(stderr, "%s needs a value\n", a.c_str()), 2;
    if (a == "--muse") muse = argv[++i];
    else if (a == "--clients") clients = std::atoi(argv[++i]);
    else if (a == "--disconnect") disconnect = std::atof(argv[++i]);
    else if (a == "--seed") seed = unsigned(std::atoi(argv[++i]));
    else if (a == "--max-tokens") g_max_tokens = std::atoi(argv[++i]);
    else return std::fprintf(stderr, "unknown flag %s\n", a.c_str()), 2;
  }
  if (muse.empty())
    return std::fprintf(stderr, "usage: server_load_test --muse PATH [--clients N] [--disconnect F] [--seed N] [--real] "
                                "[--max-tokens N] [--shared-system-prompt] [-- SERVER_FLAGS...]\n"), 2;
  signal(SIGPIPE, SIG_IGN);
  rlimit rl;  // one socket per client
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }

  // Start the server on a free port; read the port from its log.
  std::vector<std::string> flags = {"--disable-log-requests", "--shutdown-timeout", "10"};
  if (!real) {  // the fake: every client streams at once
    for (const char* a : {"--step-ms", "1", "--max-num-seqs"}) flags.push_back(a);
    flags.push_back(std::to_string(clients));
  }
  flags.insert(flags.end(), server_flags.begin(), server_flags.end());
  const auto server = muse::test_support::spawn_muse_serve(muse, flags);
  if (server.stderr_fd < 0) return 1;
  const pid_t pid = server.pid;
  const int log_fd = server.stderr_fd;
  int port = -1;
  std::string model_name;
  {
    std::string log;
    char buf[4096];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    fd_set set;
    while (port < 0 && std::chrono::steady_clock::now() < deadline) {
      FD_ZERO(&set);
      FD_SET(log_fd, &set);
      timeval tv{0, 200000};
      if (select(log_fd + 1, &set, nullptr, nullptr, &tv) > 0) {
        ssize_t n = read(log_fd, buf, sizeof buf);
        if (n <= 0) break;
        log.append(buf, size_t(n));
        size_t at = log.find("listening on 127.0.0.1:");
        size_t name_at = log.find("(model ", at);
        if (at != std::string::npos && name_at != std::string::npos && log.find_first_of(",)", name_at + 7) != std::string::npos) {
          port = std::atoi(log.c_str() + at + 23);
          model_name = log.substr(name_at + 7, log.find_first_of(",)", name_at + 7) - name_at - 7);
        }
      }
    }
    if (port < 0) {
      std::fprintf(stderr, "server did not start:\n%s\n", log.c_str());
      kill(pid, SIGKILL);
      return 1;
    }
  }
  // Keep draining the server's stderr so it never blocks on a full pipe.
  // (the tail is kept for the report when something fails: sanitizer output).
  std::string server_log_tail;
  std::thread drain([fd = log_fd, &server_log_tail] {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
      server_log_tail.append(buf, size_t(n));
      if (server_log_tail.size() > (1u << 17)) server_log_tail.erase(0, server_log_tail.size() - (1u << 16));
    }
  });
  for (int i = 0; i < 1200 && http(port, "GET", "/health", "").find(" 200 ") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));

  // References: each prompt alone.
  std::vector<std::string> reference(static_cast<size_t>(prompts));
  for (int p = 0; p < prompts; ++p) {
    reference[size_t(p)] = stream_content(http(port, "POST", "/v1/chat/completions", request_body(p)));
    if (reference[size_t(p)].empty()) {
      std::fprintf(stderr, "reference run %d failed\n", p);
      kill(pid, SIGKILL);
      return 1;
    }
  }

  std::mt19937 rng(seed);
  std::vector<size_t> cut(size_t(clients), 0);
  for (auto& c : cut)
    if (std::uniform_real_distribution<double>(0, 1)(rng) < disconnect) c = 200 + rng() % (real ? 8000 : 3000);
  std::atomic<int> ok{0}, mismatched{0}, incomplete{0}, dropped{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      int p = i % prompts;
      std::string r = http(port, "POST", "/v1/chat/completions", request_body(p), cut[size_t(i)]);
      if (cut[size_t(i)]) {
        ++dropped;
        return;
      }
      std::string content = stream_content(r);
      if (content.empty()) ++incomplete;
      else if (content != reference[size_t(p)]) {
        if (++mismatched == 1)
          std::fprintf(stderr, "first mismatch, prompt %d:\n  alone: %s\n  load:  %s\n", p, reference[size_t(p)].c_str(),
                       content.c_str());
      }
      else ++ok;
    });
  }
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // The engine must drain to idle, and the server must still answer.
  bool idle = false;
  std::string metrics;
  for (int i = 0; i < 100 && !idle; ++i) {
    metrics = http(port, "GET", "/metrics", "");
    const std::string label = "{model_name=\"" + model_name + "\"} ";
    idle = metrics.find("muse:num_requests_running" + label + "0\n") != std::string::npos &&
           metrics.find("muse:num_requests_waiting" + label + "0\n") != std::string::npos;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string after = http(port, "POST", "/v1/chat/completions", request_body(0));
  bool answers = stream_content(after) == reference[0];
  auto counter = [&](const std::string& name) {
    const std::string key = name + "{model_name=\"" + model_name + "\"} ";
    size_t at = metrics.find(key);
    return at == std::string::npos ? -1.0 : std::atof(metrics.c_str() + at + key.size());
  };
  long disconnects = long(counter("muse:http_requests_client_disconnected_total"));
  long preemptions = long(counter("muse:num_preemptions_total"));

  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  drain.join();
  bool clean_exit = WIFEXITED(status) && WEXITSTATUS(status) == 0;

  std::printf("%s, clients %d: %d complete and equal to the solo run, %d mismatched, %d incomplete, %d hung up "
              "(server counted %ld disconnects, %ld preemptions) in %.2f s\n",
              real ? "real engine" : "fake engine", clients, ok.load(), mismatched.load(), incomplete.load(), dropped.load(),
              disconnects, preemptions, secs);
  std::printf("engine idle afterwards: %s; server answers afterwards: %s; exit status on SIGTERM: %d%s\n", idle ? "yes" : "NO",
              answers ? "yes" : "NO", WIFEXITED(status) ? WEXITSTATUS(status) : -1, clean_exit ? "" : " (FAIL)");
  bool pass = mismatched == 0 && incomplete == 0 && idle && answers && clean_exit && ok + dropped == clients;
  if (!pass) std::printf("--- end of the server's log ---\n%s\n---\n", server_log_tail.c_str());
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
