// `muse serve` options: one typed struct filled from the command line
// (tools/muse/cmd_serve.cc). The API part goes to ApiServer; the engine part
// is for the backend factory (backend_factory.h) the lead wires to the engine.
#pragma once

#include <string>
#include <vector>

#include "muse/server/api_server.h"
#include "muse/speculative/spec_config.h"

namespace muse::server {

struct EngineServeOptions {
  std::string model;                 // checkpoint directory (positional MODEL or --model)
  std::string device = "cpu";        // --device cpu | cuda
  std::string tokenizer;             // --tokenizer (default: the model directory)
  int max_model_len = 0;             // 0: the checkpoint's context length
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  double gpu_memory_utilization = 0.9;
  std::string dtype = "auto";        // auto | bfloat16
  std::string quantization;          // --quantization nvfp4|mxfp4|fp8|int4: quantize a BF16 checkpoint at load
  std::string chat_template;         // --chat-template: a file, or the template text
  std::string generation_config = "auto";  // auto: the model's generation_config.json; vllm: none; or a directory
  std::string reasoning_parser;      // muse | muse_glimmer | muse_spark (validated)
  std::string tool_call_parser;
  int tensor_parallel_size = 1;     // ranks the model is split over (docs/parallel.md)
  bool enable_expert_parallel = false;  // Spark: split routed experts by expert over those ranks
  bool language_model_only = false;  // accepted; muse serves text only today
  bool enable_chunked_prefill = true;
  int64_t seed = 0;
  // KV cache (vLLM's flags): positions per full-layer block; a fixed number
  // of blocks; or a memory budget for it (0 = the default budget).
  int block_size = 0;                // 0: the engine's default (64)
  int64_t num_gpu_blocks_override = 0;
  int64_t kv_cache_memory_bytes = 0;
  std::string kv_cache_dtype = "auto";  // auto | bfloat16 (bf16) | fp8 (fp8_e4m3)
  bool enable_prefix_caching = true;    // --no-enable-prefix-caching turns it off
  std::string logprobs_mode = "processed_logprobs";  // or raw_logprobs
  int max_waiting_requests = 4096;   // queued requests beyond which submit answers 429
  SpeculativeConfig speculative;     // --speculative-config (docs/speculative.md); disabled by default
  bool enforce_eager = false;        // --enforce-eager: no CUDA graphs (every kernel launched as enqueued)
};

struct ServeOptions {
  ApiServerOptions api;
  EngineServeOptions engine;
  std::string log_level = "info";
};

}  // namespace muse::server
