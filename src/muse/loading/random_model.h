// Writes a random Muse model directory in the Hugging Face layout (config.json,
// generation_config.json, safetensors shards + index) from a config.json
// object: for loader tests, benchmarks and smoke runs. Names come from the
// name table (published spellings), shapes from describe_weights, so what
// this writes is exactly what Checkpoint::open expects.
#pragma once

#include <cstdint>
#include <string>

#include "muse/core/dtype.h"
#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse {

struct RandomModelOptions {
  uint64_t seed = 1;
  DType dtype = DType::BF16;          // matrices, embeddings, norms (routers are always F32)
  uint64_t max_shard_bytes = 0;       // 0: one model.safetensors; else shards + index
  bool per_expert_layout = false;     // Spark experts as mlp.experts.{E}.{gate,up,down}_proj.weight
  float norm_scale = 0.1f;            // offset norm gains w are uniform in ±norm_scale (residual gates ±1)
};

Status write_random_model(const std::string& dir, const Json& config_json, const RandomModelOptions& options = {});

}  // namespace muse
