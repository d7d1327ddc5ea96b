// A blocking HTTP/1.1 client over loopback, for the server's tests, the load
// test and the serving benchmark: just enough to send a request and read the
// raw reply as it arrives (no parsing beyond what each caller needs), so the
// test sees exactly the bytes the server wrote.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace muse::test_support {

// A socket connected to 127.0.0.1:port with a receive timeout (so a hung
// server fails the test instead of hanging it); -1 if nothing listens.
inline int connect_loopback(int port, int recv_timeout_s) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{recv_timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Writes all of s (MSG_NOSIGNAL: a server that hung up is an error, not SIGPIPE).
inline bool send_all(int fd, std::string_view s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

// One request with `Connection: close` and a JSON body; `on_data` sees each
// received piece and returns false to hang up early. Returns false if the
// connection could not be made.
template <class F>
bool http_exchange(int port, int recv_timeout_s, const std::string& method, const std::string& path,
                   const std::string& body, F on_data) {
  int fd = connect_loopback(port, recv_timeout_s);
  if (fd < 0) return false;
  send_all(fd, method + " " + path +
                   " HTTP/1.1\r\nHost: l\r\nConnection: close\r\nContent-Type: application/json\r\n"
                   "Content-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  char buf[65536];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0 || !on_data(std::string_view(buf, size_t(n)))) break;
  }
  close(fd);
  return true;
}

// Decodes a chunked HTTP body (the server streams SSE that way).
inline std::string dechunk(const std::string& b) {
  std::string out;
  size_t pos = 0;
  while (pos < b.size()) {
    size_t eol = b.find("\r\n", pos);
    if (eol == std::string::npos) break;
    size_t len = std::stoul(b.substr(pos, eol - pos), nullptr, 16);
    if (len == 0) break;
    out += b.substr(eol + 2, len);
    pos = eol + 2 + len + 2;
  }
  return out;
}

}  // namespace muse::test_support
