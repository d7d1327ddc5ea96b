// HTTP request parsing as `muse serve` does it: Beast's parser with the
// server's header/body limits, the error-to-status mapping and request
// building (lowercased headers, path split). Must never crash or hang; every
// failure maps to 0/400/413/431.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "muse/server/http_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  muse::server::HttpServerOptions options;
  options.max_body_bytes = 4096;
  options.max_header_bytes = 2048;
  int status = -1;
  auto req = muse::server::parse_http_request(std::string_view(reinterpret_cast<const char*>(data), size), options, &status);
  if (req) {
    if (req->body.size() > options.max_body_bytes) std::abort();
    if (req->path.find('?') != std::string::npos) std::abort();
    for (const auto& [k, v] : req->headers)
      for (char c : k)
        if (c >= 'A' && c <= 'Z') std::abort();
    (void)req->header("content-type");
  } else if (status != 0 && status != 400 && status != 413 && status != 431) {
    std::abort();
  }
  return 0;
}
