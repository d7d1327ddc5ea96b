// `muse serve`'s flags and serving loop (cmd_serve.cc), for the `muse` binary
// and for a test executable that puts another backend behind the same flags:
// tests/support/fake_model/fake_serve.cc serves the deterministic fake model
// this way, so `muse serve` itself has no testing flags.
#pragma once

#include <functional>
#include <string>

#include "muse/core/cli.h"
#include "muse/core/status.h"
#include "muse/server/generation_service.h"
#include "muse/server/serve_options.h"

namespace muse::tool {

struct ServeBackendOverride {
  std::string model_name;                     // served name when no MODEL nor --served-model-name is given
  std::function<void(ArgParser&)> add_flags;  // the executable's own flags, parsed with serve's
  std::function<Result<server::ServeBackend>(const server::ServeOptions&)> make_backend;
};

// argv[0] is the command name. Without an override, the real engine on MODEL
// (default: the embedded model); with one, MODEL is optional and unused.
int serve_main(int argc, char** argv, const ServeBackendOverride* override = nullptr);

}  // namespace muse::tool
