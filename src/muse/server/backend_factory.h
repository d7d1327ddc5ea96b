// Builds the real backend (engine + tokenizer + chat template + response
// parser) for `muse serve`: MuseModelAdapter (muse_adapter.h) and the engine
// service (engine_service.h).
#pragma once

#include "muse/core/dtype.h"

#include "muse/core/status.h"
#include "muse/model/config.h"
#include "muse/server/generation_service.h"
#include "muse/server/serve_options.h"

namespace muse::server {

// Quick checks and construction only (reads configs and the tokenizer);
// weights load later, in GenerationService::load().
Result<ServeBackend> make_engine_backend(const EngineServeOptions& options);

// The KV cache dtype --kv-cache-dtype names: auto (the device's default:
// F32 on the CPU, BF16 on CUDA), bfloat16/bf16, fp8/fp8_e4m3.
Result<DType> kv_cache_dtype(const std::string& name, bool cuda);
// KV pool pages (kv_cache.h) for the options: --num-gpu-blocks-override,
// else enough for every sequence at full length within
// --kv-cache-memory-bytes (default 1 GiB), never fewer than one
// full-length sequence needs.
Result<int64_t> kv_cache_pages(const ModelConfig& config, const EngineServeOptions& options, int64_t max_model_len,
                               int64_t block_size, DType kv_dtype);

}  // namespace muse::server
