// muse serve: the OpenAI/Anthropic-compatible HTTP server. Flags follow
// `vllm serve`; every vllm flag the project's deployment recipes use is
// recognised: implemented ones act, the others are refused by name at start.
// SIGINT/SIGTERM stop admissions, let running requests finish within
// --shutdown-timeout, cancel the rest and exit 0.
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>

#include "command.h"
#include "muse/core/cli.h"
#include "muse/core/json.h"
#include "muse/core/log.h"
#include "muse/engine/default_model.h"
#include "muse/model/weight_table.h"
#include "muse/server/backend_factory.h"
#include "muse/server/load_progress.h"
#include "muse/server/serve_options.h"
#include "serve_command.h"

namespace muse::tool {
namespace {

using namespace muse::server;

int fail(const std::string& message) {
  std::fprintf(stderr, "muse serve: %s\n", message.c_str());
  return 2;
}

// --allowed-origins etc. take a JSON list (vLLM) or a comma-separated list.
Result<std::vector<std::string>> parse_list(const std::string& flag, const std::string& v) {
  std::vector<std::string> out;
  if (!v.empty() && v[0] == '[') {
    auto j = Json::parse(v);
    if (!j.ok() || !j->is_array()) return make_error(flag + " expects a JSON list of strings, got '" + v + "'");
    for (const auto& s : j->as_array()) {
      if (!s.is_string()) return make_error(flag + " expects a JSON list of strings, got '" + v + "'");
      out.push_back(s.as_string());
    }
    return out;
  }
  size_t start = 0;
  while (start <= v.size()) {
    size_t comma = v.find(',', start);
    if (comma == std::string::npos) comma = v.size();
    std::string item = v.substr(start, comma - start);
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

void raise_fd_limit() {
  // Each streaming client holds a socket: lift the soft limit to the hard one.
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

void declare_refused(ArgParser& args) {
  // `accepted`: values that ask for what muse does anyway, so a recipe that
  // spells out a default still runs.
  struct Refused { const char* name; bool value; const char* why; std::vector<std::string> accepted; };
  static const Refused kRefused[] = {
      {"--attention-backend", true, "muse has one attention implementation per backend", {}},
      {"--compilation-config", true, "there is no torch.compile in muse; CUDA graphs are on by default and --enforce-eager turns them off", {}},
      {"--kernel-config", true, "kernel autotuning options do not apply to muse's kernels", {}},
      {"--cpu-offload-gb", true, "expert offload is not implemented yet", {"0"}},
      {"--cpu-offload-params", true, "expert offload is not implemented yet", {}},
      {"--offload-backend", true, "expert offload is not implemented yet", {}},
      {"--distributed-executor-backend", true,
       "muse runs its tensor-parallel ranks as threads of one process (one per GPU), not as Ray or torch "
       "multiprocessing workers", {"mp"}},
      {"--pipeline-parallel-size", true, "pipeline parallelism is not implemented; muse splits a model by tensor "
       "parallelism (--tensor-parallel-size)", {"1"}},
      {"--data-parallel-size", true, "data parallelism is not implemented: run one muse serve per replica", {"1"}},
      // Accepted in every form: muse runs its own implementation of the Muse
      // models, so there is no remote code either way.
      {"--trust-remote-code", false, "", {"", "true", "false", "1", "0"}},
      {"--moe-backend", true, "muse has one MoE implementation per backend", {}},
      {"--lora-modules", true, "LoRA adapters are not implemented yet", {}},
      {"--enable-lora", false, "LoRA adapters are not implemented yet", {}},
      {"--ssl-keyfile", true, "TLS is not implemented; put a reverse proxy in front", {}},
      {"--ssl-certfile", true, "TLS is not implemented; put a reverse proxy in front", {}},
      {"--trust-request-chat-template", false, "per-request chat templates are not accepted", {}},
      {"--scheduling-policy", true, "only first-come-first-served scheduling is implemented", {"fcfs"}},
      {"--swap-space", true, "muse has no CPU swap space for preempted sequences: it recomputes them", {"0"}},
      {"--download-dir", true, "muse does not download models: give a local model directory", {}},
      {"--revision", true, "muse does not download models: give a local model directory", {}},
      {"--hf-overrides", true, "config overrides are not supported; edit the model's config.json", {}},
      {"--override-generation-config", true,
       "not supported; use --generation-config DIR with the sampling defaults you want", {}},
      {"--kv-transfer-config", true, "disaggregated prefill (KV transfer between instances) is not implemented", {}},
      {"--limit-mm-per-prompt", true, "muse serves text only today (images, video and audio are not implemented)", {}},
      {"--structured-outputs-config", true,
       "muse's structured output (response_format, forced tool calls) has one built-in backend", {}},
      {"--config", true, "YAML config files are not read; pass the flags themselves", {}},
      {"--async-scheduling", false, "", {"", "true", "false", "1", "0"}},  // muse's engine loop is what it is
      {"--uvicorn-log-level", true, "there is no uvicorn in muse; use --log-level", {}},
      {"--model-path", true, "that is SGLang's spelling; give the model as the first argument (or --model)", {}},
      {"--tp-size", true, "that is SGLang's spelling; use --tensor-parallel-size", {}},
  };
  for (const auto& r : kRefused) args.unsupported(r.name, r.value, r.why, r.accepted);
  args.alias("-pp", "--pipeline-parallel-size");
  args.alias("-dp", "--data-parallel-size");
  args.alias("-O", "--compilation-config");
}

}  // namespace

int serve_main(int argc, char** argv, const ServeBackendOverride* override) {
  ServeOptions o;
  std::string speculative_json;  // --speculative-config, parsed into o.engine.speculative
  o.api.http.max_body_bytes = 64u << 20;
  std::string positional_model, max_model_len, served_names, origins, methods, headers, reasoning_field = "both";
  std::string tokenizer_mode = "auto", config_format = "auto", load_format = "auto";
  bool disable_log_requests = false, enable_auto_tool_choice = false;
  int64_t max_body_mb = 64;
  int64_t max_buffered_mb = 0;  // 0: 4 x max_body_mb
  std::string kv_cache_memory;
  bool enable_prefix_caching = false, no_prefix_caching = false;

  ArgParser args("serve", "Serve a Muse checkpoint over the OpenAI (/v1/chat/completions, /v1/completions) and Anthropic "
                          "(/v1/messages) APIs. Flags follow `vllm serve`.");
  args.positional("MODEL", &positional_model, false, "model directory (or --model; default: the embedded models/muse-tiny)");
  args.option("--model", &o.engine.model, "DIR", "model directory");
  args.option("--host", &o.api.http.host, "ADDR", "address to listen on (default 0.0.0.0)");
  args.option("--port", &o.api.http.port, "N", "port (default 8000; 0 picks a free one and logs it)");
  args.option("--api-key", &o.api.api_key, "KEY", "require this key (Authorization: Bearer KEY, or x-api-key) on every route but /health");
  args.multi("--served-model-name", &served_names, "NAME...",
             "model name(s) clients use, space- or comma-separated; the first is reported (default: the model path)");
  args.option("--max-model-len", &max_model_len, "N", "context length served (e.g. 32768, 128k; default: the model's)");
  args.option("--max-num-seqs", &o.engine.max_num_seqs, "N", "sequences decoded together (default 256)");
  args.option("--max-num-batched-tokens", &o.engine.max_num_batched_tokens, "N", "tokens per engine step, prefill chunks included (default 8192)");
  args.option("--device", &o.engine.device, "cpu|cuda", "where the model runs (default cpu; cuda needs a build with the CUDA backend and a GPU)");
  args.option("--gpu-memory-utilization", &o.engine.gpu_memory_utilization, "F", "share of GPU memory muse may use (default 0.9)");
  args.option("--block-size", &o.engine.block_size, "N", "positions per KV-cache block, both layer kinds (default 64)");
  args.option("--num-gpu-blocks-override", &o.engine.num_gpu_blocks_override, "N",
              "pages in the KV pool (a page: one block of positions for a group of layers; default: as many as "
              "--kv-cache-memory-bytes holds)");
  args.option("--kv-cache-memory-bytes", &kv_cache_memory, "SIZE",
              "memory for the KV pool, e.g. 4G or 512M (default 1 GiB on the CPU, never more than "
              "--max-num-seqs full-length sequences need)");
  args.option("--kv-cache-dtype", &o.engine.kv_cache_dtype, "T",
              "KV cache storage: auto (F32 on the CPU, BF16 on CUDA), bfloat16, or fp8 / fp8_e4m3 (E4M3 with per-layer "
              "scales, 1.0 when the checkpoint has none)");
  args.flag("--enable-prefix-caching", &enable_prefix_caching, "reuse the KV blocks of earlier requests' shared prefixes (default on)");
  args.flag("--no-enable-prefix-caching", &no_prefix_caching, "turn prefix caching off");
  args.option("--logprobs-mode", &o.engine.logprobs_mode, "MODE",
              "processed_logprobs (default: of the distribution sampled from, after penalties, bias, temperature and "
              "top-k/top-p/min-p) or raw_logprobs (the model's own distribution, vLLM's default)");
  args.option("--dtype", &o.engine.dtype, "T", "auto or bfloat16 (default auto)");
  args.option("--quantization", &o.engine.quantization, "F",
              "nvfp4, mxfp4, fp8 or int4: quantize a BF16 checkpoint's experts (fp8/int4: and attention) while loading; "
              "a quantized checkpoint's own format is read from it (docs/formats.md)");
  args.alias("-q", "--quantization");
  args.option("--tokenizer", &o.engine.tokenizer, "DIR", "tokenizer directory (default: the model directory)");
  args.option("--tokenizer-mode", &tokenizer_mode, "MODE", "auto or hf: the checkpoint's tokenizer.json (the only mode)");
  args.option("--config-format", &config_format, "F", "auto or hf: config.json (the only format)");
  args.option("--load-format", &load_format, "F", "auto or safetensors (the only format)");
  args.option("--generation-config", &o.engine.generation_config, "SRC",
              "auto: sampling defaults and stop ids from the model's generation_config.json; vllm: no sampling defaults; or a directory");
  args.option("--chat-template", &o.engine.chat_template, "FILE", "chat template file (or inline template) instead of the model's");
  args.option("--reasoning-parser", &o.engine.reasoning_parser, "NAME", "muse, muse_glimmer or muse_spark (Muse output is always parsed)");
  args.option("--tool-call-parser", &o.engine.tool_call_parser, "NAME", "muse, muse_glimmer or muse_spark");
  args.flag("--enable-auto-tool-choice", &enable_auto_tool_choice, "allow tool_choice \"auto\" (on by default in muse: the Muse parser is built in)");
  args.flag("--enable-chunked-prefill", &o.engine.enable_chunked_prefill, "split long prompts over steps (always on)");
  args.flag("--enforce-eager", &o.engine.enforce_eager,
            "launch every GPU kernel as enqueued: no CUDA graphs of decode steps (default: graphs, recorded lazily)");
  args.flag("--language-model-only", &o.engine.language_model_only, "serve text only (muse serves text only today)");
  args.option("--tensor-parallel-size", &o.engine.tensor_parallel_size, "N",
              "ranks the model is split over (attention heads, MLP rows, vocabulary; default 1); with --device cpu "
              "they run as threads of this process, with --device cuda one per GPU (docs/parallel.md)");
  args.flag("--enable-expert-parallel", &o.engine.enable_expert_parallel,
            "split the routed experts by expert over the tensor-parallel ranks (Spark needs it for TP > 1)");
  args.alias("-tp", "--tensor-parallel-size");
  args.option("--seed", &o.engine.seed, "N", "seed for requests that give none (default: random per request)");
  args.option("--speculative-config", &speculative_json, "JSON",
              "speculative decoding, vLLM's keys: '{\"method\":\"dspark\",\"model\":DIR,\"num_speculative_tokens\":N,"
              "\"draft_sample_method\":\"greedy|probabilistic\",\"rejection_sample_method\":\"standard|block\","
              "\"enable_adaptive_verification\":BOOL}' (docs/speculative.md)");
  args.option("--max-logprobs", &o.api.max_logprobs, "N", "largest logprobs/top_logprobs accepted (default 20)");
  args.option("--allowed-origins", &origins, "LIST", "CORS origins, JSON list or comma-separated; CORS is off unless given");
  args.option("--allowed-methods", &methods, "LIST", "CORS methods (default [\"*\"])");
  args.option("--allowed-headers", &headers, "LIST", "CORS headers (default [\"*\"])");
  args.flag("--allow-credentials", &o.api.allow_credentials, "CORS: allow credentials");
  args.flag("--enable-force-include-usage", &o.api.force_include_usage, "send the usage chunk on every stream");
  args.flag("--disable-log-requests", &disable_log_requests, "do not log each request at info level");
  args.option("--reasoning-field", &reasoning_field, "F", "reasoning output field: both (default), reasoning or reasoning_content");
  args.option("--max-request-body-mb", &max_body_mb, "N", "largest request body in MiB (default 64); larger get 413");
  args.option("--max-buffered-request-mb", &max_buffered_mb, "N",
              "request bytes held across all connections in MiB (default 4 x --max-request-body-mb); beyond it 503");
  args.option("--sse-keepalive-interval", &o.api.sse_keepalive_seconds, "S", "SSE keep-alive comment after S silent seconds (default 15)");
  args.option("--shutdown-timeout", &o.api.shutdown_grace_seconds, "S", "on SIGINT/SIGTERM, wait S seconds for running requests before cancelling them (default 30)");
  args.option("--log-level", &o.log_level, "L", "debug, info, warn, error (default info)");
  declare_refused(args);
  if (override && override->add_flags) override->add_flags(args);

  if (int rc = parse_flags(args, argc, argv, "serve"); rc >= 0) return rc;
  if (!positional_model.empty() && !o.engine.model.empty() && positional_model != o.engine.model)
    return fail("the model is given twice: '" + positional_model + "' (the first argument) and --model '" +
                o.engine.model + "'; give one");
  if (o.engine.model.empty()) o.engine.model = positional_model;
  bool default_model = false;
  if (o.engine.model.empty() && !override) {
    auto dir = default_model_dir();
    if (!dir.ok()) return fail(dir.message());
    o.engine.model = *dir;
    default_model = true;
    LOG_INFO("no model given: serving the embedded model %s", o.engine.model.c_str());
  }

  LogLevel level;
  if (!parse_log_level(o.log_level, &level)) return fail("--log-level: expected debug, info, warn or error, got '" + o.log_level + "'");
  set_log_level(level);
  auto check_choice = [](const std::string& flag, const std::string& v, const std::vector<std::string>& allowed) -> std::string {
    std::string list;
    for (const auto& a : allowed) {
      if (v == a) return "";
      list += (list.empty() ? "" : ", ") + a;
    }
    return flag + ": '" + v + "' is not supported (supported: " + list + ")";
  };
  struct Choice { const char* flag; std::string value; std::vector<std::string> allowed; };
  const Choice choices[] = {
      {"--tokenizer-mode", tokenizer_mode, {"auto", "hf"}},
      {"--config-format", config_format, {"auto", "hf"}},
      {"--load-format", load_format, {"auto", "safetensors"}},
      {"--dtype", o.engine.dtype, {"auto", "bfloat16", "bf16"}},
      {"--reasoning-field", reasoning_field, {"both", "reasoning", "reasoning_content"}},
      {"--reasoning-parser", o.engine.reasoning_parser.empty() ? "muse" : o.engine.reasoning_parser, {"muse", "muse_glimmer", "muse_spark"}},
      {"--tool-call-parser", o.engine.tool_call_parser.empty() ? "muse" : o.engine.tool_call_parser, {"muse", "muse_glimmer", "muse_spark"}},
  };
  for (const auto& c : choices)
    if (auto e = check_choice(c.flag, c.value, c.allowed); !e.empty()) return fail(e);
  if (!o.engine.quantization.empty() && !parse_quant_kind(o.engine.quantization).ok())
    return fail("--quantization " + o.engine.quantization + ": muse reads a quantized checkpoint's format from its "
                "config; --quantization quantizes a BF16 checkpoint while loading and takes nvfp4, mxfp4, fp8 or int4");
  if (o.engine.tensor_parallel_size < 1 || o.engine.tensor_parallel_size > 64)
    return fail("--tensor-parallel-size " + std::to_string(o.engine.tensor_parallel_size) + ": expected 1 to 64");
  if (!(o.engine.gpu_memory_utilization > 0 && o.engine.gpu_memory_utilization <= 1)) return fail("--gpu-memory-utilization must be in (0, 1]");
  if (o.engine.max_num_seqs < 1) return fail("--max-num-seqs must be >= 1");
  if (args.given("--speculative-config")) {
    if (speculative_json.empty()) return fail("--speculative-config needs a JSON object (it was empty)");
    auto sc = parse_speculative_config(speculative_json);
    if (!sc.ok()) return fail(sc.message());
    o.engine.speculative = *sc;
  }
  // Every row of a step has activation buffers (allocated once, for the
  // most rows a step may hold): beyond 2^20 rows that is tens of GB on any model.
  if (o.engine.max_num_batched_tokens < 1 || o.engine.max_num_batched_tokens > (int64_t(1) << 20))
    return fail("--max-num-batched-tokens must be in [1, 1048576], got " + std::to_string(o.engine.max_num_batched_tokens));
  // vLLM's -1: no cap (a request gets at most the vocabulary).
  if (o.api.max_logprobs == -1) o.api.max_logprobs = std::numeric_limits<int>::max();
  if (o.api.max_logprobs < 0)
    return fail("--max-logprobs must be >= 0, or -1 for no cap; got " + std::to_string(o.api.max_logprobs));
  if (o.api.http.port < 0 || o.api.http.port > 65535) return fail("--port must be in [0, 65535]");
  if (max_body_mb < 1 || max_body_mb > 4096) return fail("--max-request-body-mb must be in [1, 4096]");
  o.api.http.max_body_bytes = size_t(max_body_mb) << 20;
  if (max_buffered_mb == 0) max_buffered_mb = 4 * max_body_mb;
  if (max_buffered_mb < max_body_mb || max_buffered_mb > 65536)
    return fail("--max-buffered-request-mb must be in [--max-request-body-mb, 65536]");
  o.api.http.max_buffered_bytes = size_t(max_buffered_mb) << 20;
  // --enable-prefix-caching[=true|false] and --no-enable-prefix-caching; on by default.
  if (args.given("--enable-prefix-caching") && args.given("--no-enable-prefix-caching") && enable_prefix_caching)
    return fail("--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  o.engine.enable_prefix_caching =
      args.given("--enable-prefix-caching") ? enable_prefix_caching : !no_prefix_caching;
  if (args.given("--enable-chunked-prefill") && !o.engine.enable_chunked_prefill)
    return fail("--enable-chunked-prefill=false: muse always splits long prompts over steps (chunked prefill "
                "cannot be turned off)");
  if (args.given("--kv-cache-memory-bytes")) {
    auto n = parse_byte_size("--kv-cache-memory-bytes", kv_cache_memory);
    if (!n.ok()) return fail(n.message());
    o.engine.kv_cache_memory_bytes = *n;
  }
  if (o.engine.num_gpu_blocks_override < 0) return fail("--num-gpu-blocks-override must be >= 1");
  if (o.engine.block_size < 0 || o.engine.block_size > 4096) return fail("--block-size must be in [1, 4096]");
  if (args.given("--max-model-len")) {
    auto n = parse_token_count("--max-model-len", max_model_len);
    if (!n.ok()) return fail(n.message());
    if (*n > 1000000000) return fail("--max-model-len " + max_model_len + " is more than 10^9 tokens");
    o.engine.max_model_len = int(*n);
  }
  for (auto [flag, text, out] : {std::tuple{"--allowed-origins", &origins, &o.api.allowed_origins},
                                 std::tuple{"--allowed-methods", &methods, &o.api.allowed_methods},
                                 std::tuple{"--allowed-headers", &headers, &o.api.allowed_headers}}) {
    if (text->empty()) continue;
    auto list = parse_list(flag, *text);
    if (!list.ok()) return fail(list.message());
    *out = *list;
  }
  if (args.given("--served-model-name")) {
    auto list = parse_list("--served-model-name", served_names);
    if (!list.ok() || list->empty()) return fail("--served-model-name: expected one or more names");
    o.api.served_model_names = *list;
  } else {
    o.api.served_model_names = {override && o.engine.model.empty() ? override->model_name
                                : default_model                    ? std::string("muse-tiny")
                                                                   : o.engine.model};
  }
  o.api.reasoning_fields = reasoning_field == "reasoning" ? ReasoningFields::Reasoning
                           : reasoning_field == "reasoning_content" ? ReasoningFields::ReasoningContent
                                                                    : ReasoningFields::Both;
  o.api.use_generation_config = o.engine.generation_config != "vllm";
  o.api.log_requests = !disable_log_requests;
  (void)enable_auto_tool_choice;  // always on: muse always has the Muse tool parser

  auto b = override ? override->make_backend(o) : make_engine_backend(o.engine);
  if (!b.ok()) return std::fprintf(stderr, "%s\n", b.message().c_str()), 1;
  ServeBackend backend = std::move(b).value();

  raise_fd_limit();
  auto server = std::make_unique<ApiServer>(o.api, backend);
  if (Status s = server->listen(); !s.ok()) return std::fprintf(stderr, "muse serve: %s\n", s.message().c_str()), 1;
  LOG_INFO("muse serve: listening on %s:%d (model %s%s)", o.api.http.host.c_str(), server->port(), o.api.served_model_names[0].c_str(),
           override ? ", fake" : "");

  // Load on a side thread: /health says 503 until it is done.
  std::atomic<int> load_state{0};  // 0 loading, 1 ready, 2 failed
  std::thread loader([&] {
    LoadProgressReporter reporter(stderr);
    LoadProgress last;
    Status s = backend.service->load([&](const LoadProgress& p) {
      last = p;
      reporter.update(p);
    });
    if (!s.ok()) {
      LOG_ERROR("loading failed: %s", s.message().c_str());
      load_state = 2;
      server->shutdown();
      return;
    }
    reporter.done(last);
    server->set_ready();
    load_state = 1;
    LOG_INFO("ready: http://%s:%d/v1", o.api.http.host.c_str(), server->port());
  });
  server->run();
  if (load_state == 0) {
    // Interrupted while loading: nothing to drain, the loader cannot be stopped.
    LOG_INFO("interrupted while loading; exiting");
    std::fflush(stderr);
    std::_Exit(0);
  }
  loader.join();
  int code = load_state == 2 ? 1 : 0;
  // The service's threads may still deliver into the server: stop them first.
  backend.service.reset();
  server.reset();
  LOG_INFO("muse serve: stopped");
  return code;
}

namespace {
int serve_command(int argc, char** argv) { return serve_main(argc, argv); }
}  // namespace

MUSE_COMMAND("serve", "serve a model over the OpenAI and Anthropic HTTP APIs", serve_command, 20);

}  // namespace muse::tool
