// Starts `muse serve` on a free loopback port (--port 0) as a child process
// whose standard error comes back through a pipe, for the load test and the
// serving benchmark: the caller reads the port from the log and keeps
// draining the pipe so the server never blocks on it.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace muse::test_support {

struct SpawnedServer {
  pid_t pid = -1;
  int stderr_fd = -1;  // read end; -1 when the pipe could not be made
};

inline SpawnedServer spawn_muse_serve(const std::string& muse, const std::vector<std::string>& flags) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return {};
  std::vector<std::string> args = {muse, "serve", "--host", "127.0.0.1", "--port", "0"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    execv(muse.c_str(), argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  return {pid, pipefd[0]};
}

}  // namespace muse::test_support
