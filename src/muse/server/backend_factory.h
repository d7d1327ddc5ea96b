// Builds the real backend (engine + tokenizer + chat template + response
// parser) for `muse serve`. THE LEAD WIRES THIS: backend_factory.cc is a stub
// until the engine, tokenizer and chat code implement GenerationService and
// ModelAdapter (generation_service.h).
#pragma once

#include "muse/core/status.h"
#include "muse/server/generation_service.h"
#include "muse/server/serve_options.h"

namespace muse::server {

// Quick checks and construction only (reads configs and the tokenizer);
// weights load later, in GenerationService::load().
Result<ServeBackend> make_engine_backend(const EngineServeOptions& options);

}  // namespace muse::server
