// `muse serve MODEL`: the engine behind the server. Reads the config and the
// tokenizer files here (quick, so a bad directory fails before listening);
// the weights load later in GenerationService::load().
#include "muse/server/backend_factory.h"

#include <sys/stat.h>

#include <algorithm>

#include "muse/core/log.h"
#include "muse/server/engine_service.h"
#include "muse/server/muse_adapter.h"

namespace muse::server {

namespace {

bool is_directory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Default KV budget on the CPU backend (the CPU backend commits what it allocates).
constexpr int64_t kDefaultKvBytes = int64_t(1) << 30;

}  // namespace

Result<DType> kv_cache_dtype(const std::string& name, bool cuda) {
  if (name == "auto") return cuda ? DType::BF16 : DType::F32;
  if (name == "bfloat16" || name == "bf16") return DType::BF16;
  if (name == "fp8" || name == "fp8_e4m3") return DType::F8_E4M3;
  return make_error("--kv-cache-dtype '" + name + "' is not supported (auto, bfloat16, fp8, fp8_e4m3)");
}

Result<int64_t> kv_cache_pages(const ModelConfig& config, const EngineServeOptions& o, int64_t max_model_len,
                               int64_t block_size, DType kv_dtype) {
  const EngineOptions defaults;
  const KvGeometry g = KvGeometry::of(config, block_size, defaults.kv_max_rollback, dtype_bits(kv_dtype) / 8);
  // One sequence feeds at most min(batched tokens, context) rows per step.
  const int64_t transient = g.step_transient_pages(std::min<int64_t>(o.max_num_batched_tokens, max_model_len));
  const int64_t one = g.pages_for(max_model_len) + transient;  // one full-length sequence
  if (o.num_gpu_blocks_override > 0) {
    if (o.num_gpu_blocks_override < one)
      return make_error("--num-gpu-blocks-override " + std::to_string(o.num_gpu_blocks_override) +
                        " pages are fewer than one sequence of --max-model-len " + std::to_string(max_model_len) +
                        " needs (" + std::to_string(one) + " pages)");
    return o.num_gpu_blocks_override;
  }
  const int64_t budget = o.kv_cache_memory_bytes > 0 ? o.kv_cache_memory_bytes : kDefaultKvBytes;
  const int64_t fit = budget / g.page_bytes();
  const int64_t pages = g.pool_pages(o.max_num_seqs, max_model_len, o.max_num_batched_tokens, budget);
  if (pages < one && o.kv_cache_memory_bytes > 0)
    return make_error("--kv-cache-memory-bytes " + std::to_string(o.kv_cache_memory_bytes) + " holds " + std::to_string(fit) +
                      " pages, fewer than one sequence of --max-model-len " + std::to_string(max_model_len) + " needs (" +
                      std::to_string(one) + " pages of " + std::to_string(g.page_bytes()) + " bytes)");
  return std::max(pages, one);
}

Result<ServeBackend> make_engine_backend(const EngineServeOptions& options) {
  const EngineServeOptions& o = options;
  if (!is_directory(o.model)) return make_error("muse serve: model directory '" + o.model + "' does not exist or is not a directory");
  auto config = load_model_config(o.model);
  if (!config.ok()) return make_error("muse serve: " + config.message());
  const int64_t model_max = config->max_position_embeddings > 0 ? config->max_position_embeddings : 8192;
  int64_t max_model_len = o.max_model_len > 0 ? o.max_model_len : model_max;
  if (max_model_len > model_max)
    return make_error("muse serve: --max-model-len " + std::to_string(max_model_len) + " exceeds the model's context (max_position_embeddings " +
                      std::to_string(model_max) + ")");
  if (o.logprobs_mode != "processed_logprobs" && o.logprobs_mode != "raw_logprobs")
    return make_error("muse serve: --logprobs-mode '" + o.logprobs_mode + "' is not supported (processed_logprobs, raw_logprobs)");
  if (o.block_size < 0 || o.block_size > 4096) return make_error("muse serve: --block-size must be in [1, 4096]");
  // The drafter is loaded after the server listens: check its directory now.
  if (o.speculative.enabled) {
    const std::string& d = o.speculative.model;
    if (d.empty() || !is_directory(d) || !file_exists(d + "/config.json"))
      return make_error("muse serve: --speculative-config: the drafter model '" + d +
                        "' is not a directory with a config.json");
  }
  if (o.num_gpu_blocks_override > (int64_t(1) << 30))
    return make_error("muse serve: --num-gpu-blocks-override " + std::to_string(o.num_gpu_blocks_override) +
                      " is more than 2^30 pages");

  auto device = parse_device(o.device);
  if (!device.ok()) return make_error("muse serve: " + device.message());
  if (Status st = check_devices(*device, o.tensor_parallel_size); !st.ok()) return make_error("muse serve: " + st.message());
  const ParallelOptions parallel{o.tensor_parallel_size, o.enable_expert_parallel};
  if (Status st = check_parallel(*config, parallel); !st.ok()) return make_error("muse serve: " + st.message());

  auto adapter = MuseModelAdapter::create(o, *config, int(max_model_len));
  if (!adapter.ok()) return make_error("muse serve: " + adapter.message());
  // The output parser follows the model's chat template; a parser named for
  // the other family would be ignored, so it is an error.
  for (const auto& [flag, parser] : {std::pair<const char*, const std::string&>{"--reasoning-parser", o.reasoning_parser},
                                     std::pair<const char*, const std::string&>{"--tool-call-parser", o.tool_call_parser}}) {
    const std::string profile = (*adapter)->profile_name();
    if ((parser == "muse_glimmer" || parser == "muse_spark") && parser != profile)
      return make_error("muse serve: " + std::string(flag) + " " + parser + ": the model's chat template is the " +
                        profile + " format, whose parser muse uses (give muse or " + profile + ")");
  }

  EngineServiceOptions so;
  so.model_dir = o.model;
  so.seed = o.seed;
  EngineOptions& eo = so.engine;
  eo.backend.device = *device;
  eo.backend.gpu_graphs = !o.enforce_eager;
  if (!o.quantization.empty()) {
    auto q = parse_quant_kind(o.quantization);
    if (!q.ok()) return make_error("muse serve: --quantization: " + q.message());
    eo.quantization = *q;
  }
  eo.max_batch_tokens = o.max_num_batched_tokens;
  eo.max_sequences = o.max_num_seqs;
  eo.max_model_len = max_model_len;
  if (o.block_size > 0) eo.kv_block_size = o.block_size;
  eo.gpu_memory_utilization = o.gpu_memory_utilization;
  eo.kv_cache_memory_bytes = o.kv_cache_memory_bytes;
  auto kv_dtype = kv_cache_dtype(o.kv_cache_dtype, *device == Device::Cuda);
  if (!kv_dtype.ok()) return make_error("muse serve: " + kv_dtype.message());
  eo.kv_cache_dtype = *kv_dtype;
  if (*device == Device::Cpu || o.num_gpu_blocks_override > 0) {
    auto pages = kv_cache_pages(*config, o, max_model_len, eo.kv_block_size, *kv_dtype);
    if (!pages.ok()) return make_error("muse serve: " + pages.message());
    eo.kv_pages = *pages;
  } else {
    // On the GPU the engine sizes the pool once the weights are resident
    // (what --gpu-memory-utilization or --kv-cache-memory-bytes leaves).
    eo.kv_pages = 0;
  }
  eo.parallel = parallel;
  eo.prefix_caching = o.enable_prefix_caching;
  eo.load.language_model_only = o.language_model_only;
  SchedulerOptions& sc = so.scheduler;
  sc.eos_token_ids = (*adapter)->info().eos_token_ids;
  // Never sample an id the tokenizer has no token for (muse-tiny: rows
  // 4096..4159 of the embedding are padding; Spark: >= 201,818).
  sc.sampled_vocab_size = (*adapter)->tokenizer().id_limit();
  sc.logprobs_mode = o.logprobs_mode == "raw_logprobs" ? LogprobsMode::Raw : LogprobsMode::Processed;
  sc.max_waiting_requests = o.max_waiting_requests;
  sc.speculative = o.speculative;
  LOG_INFO("model %s: %s, chat profile %s, %zu EOS ids, tokenizer %s", o.model.c_str(), config->model_type.c_str(),
           (*adapter)->profile_name().c_str(), sc.eos_token_ids.size(), (*adapter)->tokenizer().describe().c_str());

  so.tokenizer = (*adapter)->tokenizer();
  so.constraints = [a = *adapter](const Json& c) { return a->constraint_factory(c); };

  ServeBackend b;
  b.adapter = *adapter;
  b.service = make_engine_service(std::move(so));
  return b;
}

}  // namespace muse::server
