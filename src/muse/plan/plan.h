// `muse plan`: size a deployment from the engine's own model description
// before downloading it. Method, assumptions and sources: docs/plan.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/plan/hardware.h"
#include "muse/plan/model_profiles.h"
#include "muse/plan/weight_format.h"

namespace muse::plan {

// The options of `muse plan`, named after `vllm serve` flags where one exists.
struct PlanOptions {
  std::string model;                  // profile name, config.json or model directory
  std::string weight_format;          // "" = from the profile / quantization_config
  std::string hardware;               // profile name; "" = fully described by overrides
  HardwareOverrides overrides;
  int64_t max_model_len = 0;          // 0 = the model's max_position_embeddings
  int64_t max_num_seqs = 256;         // vLLM's default
  int64_t max_num_batched_tokens = 8192;
  double gpu_memory_utilization = 0.9;
  std::string kv_cache_dtype = "auto";  // auto|bf16|bfloat16|fp8|fp8_e4m3|fp8_e5m2|f32 (the CPU's auto)
  int64_t block_size = 64;              // KV block (--block-size), for the paged pool's arithmetic
  int64_t kv_cache_memory_bytes = 0;    // --kv-cache-memory-bytes: the pool's budget (else the machine's KV budget)
  std::optional<double> cpu_offload_gib;  // per GPU, as vLLM's --cpu-offload-gb; unset = minimum needed
  std::vector<std::string> cpu_offload_params;  // name segments (vLLM --cpu-offload-params)
  std::string drafter;                // drafter profile / config.json
  std::string speculative_config;     // vLLM --speculative-config JSON
  bool language_model_only = false;   // skip the vision and audio towers
  int64_t decode_context = 0;         // context for the decode ceiling; 0 = min(4096, max_model_len)
  std::optional<double> runtime_overhead_gib;  // per GPU; unset = our estimate
  bool expert_parallel = false;       // --enable-expert-parallel (docs/parallel.md): experts split by expert
};

// Sums by weight-table part (parameters or bytes).
struct PartSums {
  int64_t experts = 0, attention = 0, latent = 0, embeddings = 0, head = 0, router = 0, norms = 0,
          residual_gates = 0, dense_mlp = 0;
  int64_t total() const {
    return experts + attention + latent + embeddings + head + router + norms + residual_gates + dense_mlp;
  }
  void add(WeightPart part, int64_t n);
};

struct KvPlan {
  std::string dtype;                   // "bf16" | "fp8"
  int bytes_per_value = 2;
  int64_t layers = 0, full_layers = 0, sliding_layers = 0, window = 0;
  int64_t values_per_token_all_full = 0;   // K and V of every layer
  int64_t bytes_per_token_all_full = 0;
  int64_t bytes_per_token = 0;             // full-attention layers only: what grows with context
  int64_t sliding_bytes_per_sequence = 0;  // rings of min(window, max_model_len) tokens
  int64_t bytes_at_max_model_len = 0;      // one sequence, hybrid
  int64_t all_full_bytes_at_max_model_len = 0;
  int64_t replication = 1;                 // copies of each KV head when GPUs > KV heads
  int64_t drafter_bytes_per_sequence = 0;
  int64_t drafter_bytes_per_token = 0;
  int64_t budget_bytes = 0;                // all GPUs, after weights and overhead (may be < 0)
  int64_t capacity_tokens = 0;             // full-attention tokens that fit beside one sequence's rings
  int64_t max_concurrency = 0;             // max_model_len sequences that fit, capped at max_num_seqs
  // The engine's paged pool (kv/kv_geometry.h, the same code `muse serve` sizes with).
  struct Pool {
    int64_t block_size = 0, page_bytes = 0, max_rollback = 0;
    int64_t pages_at_max_model_len = 0, bytes_at_max_model_len = 0;  // one sequence between steps
    bool sized = false;                  // a budget is known
    int64_t budget_bytes = 0, pages = 0;
    int64_t longest_sequence_tokens = 0;  // one sequence alone (one step's transient kept free)
  } pool;
};

struct MemoryPlan {  // per GPU (per device)
  int64_t device_bytes = 0, budget_bytes = 0;
  int64_t decoder_weights = 0, towers = 0, drafter = 0, activations = 0, runtime_overhead = 0, kv_budget = 0;
  bool overhead_estimated = true;
};

struct OffloadPlan {
  bool possible = false;        // discrete GPUs with host memory and a link
  bool automatic = false;       // chosen by the planner (no --cpu-offload-gb)
  double gib_per_gpu = 0;       // vLLM --cpu-offload-gb
  std::vector<std::string> params;  // --cpu-offload-params
  int64_t bytes = 0;            // all GPUs
  int64_t tensors = 0;          // per GPU
  int first_layer = -1, last_layer = -1;
  std::string last_tensor;      // where the budget ran out
  std::optional<int64_t> minimum_gib_per_gpu;  // smallest integer budget that fits, when one exists
};

struct PinnedPlan {  // whole machine
  int64_t exact = 0;            // sum of buffer sizes (VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY=1)
  int64_t power_of_two = 0;     // each buffer rounded up (PyTorch CachingHostAllocator)
  int64_t buffers = 0;
  int64_t largest_buffer = 0;
  int64_t staging_pageable = 0; // transient pageable copy of one tensor while it is pinned
  int64_t host_memory = 0;
};

struct DecodePlan {
  int64_t context = 0;
  double host_link_bytes_per_token = 0;   // all GPUs
  double device_bytes_per_token = 0;      // per GPU (weights + KV it reads)
  double kv_read_bytes_per_token = 0;     // all GPUs, included above
  double host_path_bandwidth = 0;         // min(GPUs x link, host DRAM)
  double device_bandwidth = 0;            // per GPU
  double ceiling_tokens_per_s = 0;        // link and memory reads overlapped (an upper bound)
  double serialized_tokens_per_s = 0;     // one after the other
  double ceiling_at_max_model_len = 0;
  std::string bound;                      // "host link" | "device memory"
};

struct Plan {
  PlanOptions options;  // as resolved (max_model_len, decode_context filled in)
  // Without --hardware or machine figures the plan covers the model only
  // (parameters, weight bytes, KV per token); the rest stays empty.
  bool has_hardware = true;
  ResolvedModel model;
  HardwareProfile hardware;
  DrafterChoice drafter;
  PartSums params, bytes;
  TowerEstimate vision, audio;
  int64_t drafter_params = 0;
  std::vector<StoredTensor> tensors;
  KvPlan kv;
  MemoryPlan memory;
  OffloadPlan offload;
  PinnedPlan pinned;
  DecodePlan decode;
  bool fits = false;
  std::vector<std::string> problems;  // why it does not fit
  std::vector<std::string> warnings;
};

// Bad input (unknown names, impossible numbers, invalid configs) is an error;
// no hardware at all gives a model-only plan;
// a valid deployment that does not fit is a Plan with fits == false and the
// reasons in `problems`.
Result<Plan> make_plan(const PlanOptions& options);

Json plan_to_json(const Plan& plan);
std::string plan_to_table(const Plan& plan);

// Smallest power of two >= n (n >= 1), as PyTorch's pinned allocator rounds.
int64_t round_up_power_of_two(int64_t n);

}  // namespace muse::plan
