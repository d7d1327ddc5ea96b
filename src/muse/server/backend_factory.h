// Builds the real backend (engine + tokenizer + chat template + response
// parser) for `muse serve`: MuseModelAdapter (muse_adapter.h) and the engine
// service (engine_service.h).
#pragma once

#include "muse/core/status.h"
#include "muse/model/config.h"
#include "muse/server/generation_service.h"
#include "muse/server/serve_options.h"

namespace muse::server {

// Quick checks and construction only (reads configs and the tokenizer);
// weights load later, in GenerationService::load().
Result<ServeBackend> make_engine_backend(const EngineServeOptions& options);

// Full-attention KV blocks for the options: --num-gpu-blocks-override, else
// enough for every sequence at full length within --kv-cache-memory-bytes
// (default 1 GiB), never fewer than one full-length sequence needs. 0 when
// the model has no full-attention layers.
Result<int64_t> kv_cache_blocks(const ModelConfig& config, const EngineServeOptions& options, int64_t max_model_len,
                                int64_t block_size);

}  // namespace muse::server
