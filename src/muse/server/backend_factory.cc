#include "muse/server/backend_factory.h"

namespace muse::server {

Result<ServeBackend> make_engine_backend(const EngineServeOptions& options) {
  return make_error("muse serve: the engine is not wired into the server yet (src/muse/server/backend_factory.cc); "
                    "'" + options.model + "' cannot be served. For testing, --fake-model serves a deterministic fake.");
}

}  // namespace muse::server
