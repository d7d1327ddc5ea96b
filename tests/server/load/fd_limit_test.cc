// Issue 17 item 3: the HTTP server at the descriptor limit. A child process
// lowers RLIMIT_NOFILE to 128, starts an HttpServer (asking for 100000
// connections), then takes every free descriptor so that accept() fails with
// EMFILE. While it does, the server must not spin (CPU time bounded) nor
// flood its log (one line per interval); once descriptors are free again it
// must serve the clients that waited. Loopback only; about 5 s.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "muse/server/http_server.h"

#include "../../support/loopback_client.h"

using namespace muse::server;
using Clock = std::chrono::steady_clock;

namespace {

// utime + stime of a process, in seconds.
double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t close_paren = all.rfind(')');
  if (close_paren == std::string::npos) return -1;
  std::istringstream rest(all.substr(close_paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i)
    if (i == 14 || i == 15) ticks += std::stod(field);
  return ticks / double(sysconf(_SC_CLK_TCK));
}

[[noreturn]] void run_child(int port_fd, int log_fd) {
  dup2(log_fd, 2);
  rlimit lim{128, 128};
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(2);
  HttpServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.max_connections = 100000;
  HttpServer srv(
      o,
      [](std::shared_ptr<HttpExchange> ex) {
        HttpResponse r;
        r.body = "ok";
        ex->respond(std::move(r));
      },
      [](int status, std::string_view, std::string message) { return HttpResponse{status, "text/plain", {}, message}; });
  if (!srv.listen().ok()) _exit(3);
  std::string hello = std::to_string(srv.port()) + " " + std::to_string(srv.max_connections()) + "\n";
  if (write(port_fd, hello.data(), hello.size()) != ssize_t(hello.size())) _exit(4);
  // Take every free descriptor; give them back after 2.5 s.
  std::vector<int> hoard;
  for (;;) {
    int f = open("/dev/null", O_RDONLY);
    if (f < 0) break;
    hoard.push_back(f);
  }
  auto start = Clock::now();
  srv.every(std::chrono::milliseconds(100), [&] {
    if (!hoard.empty() && Clock::now() - start > std::chrono::milliseconds(2500)) {
      for (int f : hoard) close(f);
      hoard.clear();
    }
  });
  srv.run();
  _exit(0);
}

}  // namespace

int main() {
  int port_pipe[2], log_pipe[2];
  if (pipe(port_pipe) != 0 || pipe(log_pipe) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) run_child(port_pipe[1], log_pipe[1]);
  close(port_pipe[1]);
  close(log_pipe[1]);
  char hello[64] = {};
  ssize_t n = read(port_pipe[0], hello, sizeof hello - 1);
  int port = 0, cap = 0;
  if (n <= 0 || std::sscanf(hello, "%d %d", &port, &cap) != 2) {
    std::fprintf(stderr, "FAIL: the server did not start\n");
    return 1;
  }
  bool ok = true;
  std::printf("max connections with 128 descriptors: %d\n", cap);
  if (cap >= 128 || cap < 1) {
    std::printf("FAIL: max_connections not capped by RLIMIT_NOFILE\n");
    ok = false;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the hoard is taken
  std::vector<int> clients;
  for (int i = 0; i < 30; ++i) {
    int fd = muse::test_support::connect_loopback(port, 8);
    if (fd < 0) continue;
    muse::test_support::send_all(fd, "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    clients.push_back(fd);
  }
  double cpu0 = cpu_seconds(pid);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  double spent = cpu_seconds(pid) - cpu0;
  std::printf("server CPU while out of descriptors: %.3f s in 2 s\n", spent);
  if (spent > 0.3) {
    std::printf("FAIL: the accept loop spins at the descriptor limit\n");
    ok = false;
  }
  int served = 0;
  for (int fd : clients) {
    std::string reply;
    char buf[4096];
    for (;;) {
      ssize_t got = recv(fd, buf, sizeof buf, 0);
      if (got <= 0) break;
      reply.append(buf, size_t(got));
    }
    served += reply.rfind("HTTP/1.1 200", 0) == 0;
    close(fd);
  }
  std::printf("clients served once descriptors were free: %d of %zu\n", served, clients.size());
  if (served != int(clients.size()) || clients.empty()) {
    std::printf("FAIL: waiting clients were not served after the limit eased\n");
    ok = false;
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  std::string log;
  char buf[4096];
  while ((n = read(log_pipe[0], buf, sizeof buf)) > 0) log.append(buf, size_t(n));
  int lines = 0;
  for (size_t at = log.find("accept failed"); at != std::string::npos; at = log.find("accept failed", at + 1)) ++lines;
  std::printf("'accept failed' log lines: %d (%zu bytes of log)\n", lines, log.size());
  if (lines < 1 || lines > 2 || log.size() > 4096) {
    std::printf("FAIL: accept errors must be logged once per interval\n%s\n", log.substr(0, 2000).c_str());
    ok = false;
  }
  std::printf(ok ? "PASS\n" : "FAIL\n");
  return ok ? 0 : 1;
}
