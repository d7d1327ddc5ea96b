// muse run: generate from a model directory on the CPU. The prompt is text
// (--prompt, rendered through the chat template as one user message unless
// --raw; the decoded text streams to stdout as it is generated) or token ids
// (--prompt-ids; the generated ids are printed). Greedy by default
// (--temperature 0) so runs are reproducible; --dump-logits writes every
// prompt and fed position's logits for checking against a reference. Without
// a model, the embedded models/muse-tiny is used.
//
// Generation is the server's: one request to the engine service
// (server/engine_service.h), which runs the scheduler and each sequence's
// SequenceSampler, detokenizes and reports the finish; the same seed gives
// the same tokens as a server request with that seed.
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "command.h"
#include "muse/backends/factory/backend_factory.h"
#include "muse/chat/request_render.h"
#include "muse/core/cli.h"
#include "muse/core/json.h"
#include "muse/core/log.h"
#include "muse/engine/default_model.h"
#include "muse/engine/engine.h"
#include "muse/server/engine_service.h"
#include "muse/tokenizer/tokenizer_files.h"

namespace muse::tool {
namespace {

static_assert(std::endian::native == std::endian::little, "--dump-logits writes the host's float32 layout");

// --max-tokens not given (every value a user can type, -1 included, is checked).
constexpr int64_t kUnset = std::numeric_limits<int64_t>::min();

struct RunOptions {
  std::string model;
  std::string prompt_ids;
  std::string prompt;
  bool raw = false;
  bool skip_special_tokens = false;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t seed = 0;
  int64_t max_tokens = kUnset;  // kUnset: 16 with --prompt-ids, 512 with --prompt
  bool json = false;
  std::string dump_logits;
  int threads = 0;
  std::string device = "cpu";
  bool language_model_only = false;
  bool ignore_eos = false;
  int64_t max_num_batched_tokens = 256;
  bool enforce_eager = false;  // no CUDA graphs
  ParallelOptions parallel;  // --tensor-parallel-size, --enable-expert-parallel (docs/parallel.md)
};

bool is_directory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int fail(const std::string& message) {
  std::fprintf(stderr, "muse run: %s\n", message.c_str());
  return 1;
}

// The request's deliveries, handed from the engine thread to the main thread
// (which writes them), as the server's sink does.
class RunSink : public server::GenerationSink {
 public:
  void on_output(server::GenerationOutput output) override {
    std::lock_guard lock(mu_);
    outputs_.push_back(std::move(output));
    cv_.notify_one();
  }
  void on_complete(server::GenerationSummary summary) override {
    std::lock_guard lock(mu_);
    summary_ = std::move(summary);
    done_ = true;
    cv_.notify_one();
  }
  // Waits for deliveries; true once the request is complete (then `summary` is set).
  bool wait(std::vector<server::GenerationOutput>* outputs, server::GenerationSummary* summary) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_ || !outputs_.empty(); });
    outputs->swap(outputs_);
    if (done_) *summary = summary_;
    return done_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<server::GenerationOutput> outputs_;
  server::GenerationSummary summary_;
  bool done_ = false;
};

int run_command(int argc, char** argv) {
  RunOptions o;
  std::string positional_model, quantization;
  ArgParser args("run",
                 "Generate from a Hugging Face Muse model directory on the CPU (default: the embedded "
                 "models/muse-tiny). Greedy unless --temperature > 0. With --prompt, streams the generated text; with "
                 "--prompt-ids, prints the generated ids (or one JSON object with --json).");
  args.positional("MODEL_DIR", &positional_model, false, "model directory (or --model; default: models/muse-tiny)");
  args.option("--model", &o.model, "DIR", "model directory: config.json + safetensors");
  args.alias("-m", "--model");
  args.option("--prompt", &o.prompt, "TEXT", "a user message, rendered with the model's chat template (raw text with --raw)");
  args.flag("--raw", &o.raw, "use --prompt as the prompt text itself (tokenized with special tokens, e.g. BOS)");
  args.flag("--skip-special-tokens", &o.skip_special_tokens, "leave special tokens (framing markers) out of the streamed text");
  args.option("--prompt-ids", &o.prompt_ids, "IDS", "prompt as comma-separated token ids, e.g. 1,2,3");
  args.option("--max-tokens", &o.max_tokens, "N", "tokens to generate (default 16 with --prompt-ids, 512 with --prompt)");
  args.option("--temperature", &o.temperature, "T", "0 = greedy (default); > 0 samples from softmax(logits / T)");
  args.option("--top-k", &o.top_k, "K", "sample among the K most likely tokens (0 = all, default)");
  args.option("--top-p", &o.top_p, "P", "nucleus sampling mass (1 = off, default)");
  args.option("--seed", &o.seed, "N", "sampling seed (default 0): the same seed gives the same tokens");
  args.flag("--ignore-eos", &o.ignore_eos, "keep generating after an end-of-sequence id");
  args.flag("--json", &o.json, "print one JSON object: ids, counts, finish reason, timings");
  args.option("--dump-logits", &o.dump_logits, "FILE",
              "write float32 little-endian logits [positions x vocab]: every prompt position, then every fed "
              "generated token");
  args.option("--threads", &o.threads, "N", "CPU threads (default: all available)");
  args.option("--device", &o.device, "cpu|cuda", "where the model runs (default cpu)");
  args.option("--quantization", &quantization, "F", "nvfp4, mxfp4, fp8 or int4: quantize a BF16 checkpoint while loading");
  args.option("--max-num-batched-tokens", &o.max_num_batched_tokens, "N", "prefill chunk, tokens per step (default 256)");
  std::string speculative_json;
  args.option("--speculative-config", &speculative_json, "JSON",
              "speculative decoding, as `muse serve` takes it (docs/speculative.md)");
  args.flag("--enforce-eager", &o.enforce_eager, "--device cuda: no CUDA graphs (every kernel launched as enqueued)");
  args.flag("--language-model-only", &o.language_model_only, "skip vision/audio tensors in the checkpoint");
  args.option("--tensor-parallel-size", &o.parallel.tensor_parallel_size, "N",
              "ranks the model is split over (--device cpu: threads of this process; default 1)");
  args.alias("-tp", "--tensor-parallel-size");
  args.flag("--enable-expert-parallel", &o.parallel.expert_parallel, "split the routed experts by expert over the ranks");
  if (int rc = parse_flags(args, argc, argv, "run"); rc >= 0) return rc;

  if (o.model.empty()) o.model = positional_model;
  if (o.model.empty()) {
    auto dir = default_model_dir();
    if (!dir.ok()) return fail(dir.message());
    o.model = *dir;
  }
  if (!is_directory(o.model)) return fail("model directory '" + o.model + "' does not exist or is not a directory");
  const bool text_mode = !o.prompt.empty();
  if (text_mode == !o.prompt_ids.empty())
    return fail(text_mode ? "give --prompt or --prompt-ids, not both"
                          : "--prompt TEXT or --prompt-ids is required (e.g. --prompt-ids 1,2,3)");
  if (o.raw && !text_mode) return fail("--raw applies to --prompt");
  if (o.max_tokens == kUnset) o.max_tokens = text_mode ? 512 : 16;
  if (o.max_tokens < 1) return fail("--max-tokens must be at least 1");

  // Text prompts: the tokenizer (and chat template) of the model directory.
  TokenizerFiles files;
  std::vector<int64_t> text_ids;
  if (text_mode) {
    auto f = load_tokenizer_files(o.model);
    if (!f.ok()) return fail(f.message());
    files = std::move(f).value();
    if (o.raw) {
      for (int32_t id : files.tokenizer.encode(o.prompt, /*add_special_tokens=*/true)) text_ids.push_back(id);
    } else {
      auto model_type = chat::read_model_type(o.model);
      if (!model_type.ok()) return fail(model_type.message());
      auto tpl = chat::ChatTemplate::from_tokenizer_files(files, *model_type);
      if (!tpl.ok()) return fail(tpl.message() + " (or use --raw)");
      Json msg = Json::object();
      msg.set("role", "user");
      msg.set("content", o.prompt);
      Json request = Json::object();
      Json messages = Json::array();
      messages.push_back(std::move(msg));
      request.set("messages", std::move(messages));
      auto text = chat::render_chat_prompt(request, *tpl);
      if (!text.ok()) return fail(text.message());
      for (int32_t id : files.tokenizer.encode(*text, /*add_special_tokens=*/false)) text_ids.push_back(id);
    }
  }
  auto ids = text_mode ? Result<std::vector<int64_t>>(text_ids) : parse_int_list(o.prompt_ids);
  if (!ids.ok()) return fail("--prompt-ids: " + ids.message());
  if (ids->empty()) return fail(text_mode ? "--prompt: the prompt is empty" : "--prompt-ids: the prompt is empty");
  if (o.threads < 0) return fail("--threads must be >= 0 (0 = all CPUs)");
  if (o.seed < 0) return fail("--seed must be >= 0");
  if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
    return fail("temperature must be a finite number >= 0 (got " + std::to_string(o.temperature) + ")");
  if (o.top_k < 0) return fail("top_k must be >= 0 (0 disables it)");
  if (!(o.top_p > 0.0 && o.top_p <= 1.0)) return fail("top_p must be in (0, 1]");
  if (o.max_tokens > std::numeric_limits<int>::max()) return fail("--max-tokens is too large");

  auto device = parse_device(o.device);
  if (!device.ok()) return fail(device.message());
  if (Status st = check_devices(*device, o.parallel.tensor_parallel_size); !st.ok()) return fail(st.message());
  EngineOptions eo;
  eo.parallel = o.parallel;
  eo.backend.device = *device;
  eo.backend.cpu.threads = o.threads;
  eo.backend.gpu_graphs = !o.enforce_eager;
  if (!quantization.empty()) {
    auto q = parse_quant_kind(quantization);
    if (!q.ok()) return fail("--quantization: " + q.message());
    eo.quantization = *q;
  }
  eo.load.language_model_only = o.language_model_only;
  eo.max_batch_tokens = o.max_num_batched_tokens;
  eo.max_sequences = 1;
  eo.max_model_len = int64_t(ids->size()) + o.max_tokens;
  // Read the config first so bad ids fail before the weights load.
  auto config = load_model_config(o.model);
  if (!config.ok()) return fail(config.message());
  const ModelConfig& c = *config;
  const int64_t V = c.vocab_size;
  std::vector<int32_t> prompt;
  for (int64_t id : *ids) {
    if (id < 0 || id >= V)
      return fail("--prompt-ids: id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
    prompt.push_back(int32_t(id));
  }
  if (c.max_position_embeddings > 0 && eo.max_model_len > c.max_position_embeddings)
    return fail("prompt + --max-tokens (" + std::to_string(eo.max_model_len) + ") exceeds the model's " +
                "max_position_embeddings (" + std::to_string(c.max_position_embeddings) + ")");

  // The server's generation path: engine service -> scheduler -> sequence sampler.
  server::EngineServiceOptions so;
  so.model_dir = o.model;
  so.engine = eo;
  {
    auto sc = parse_speculative_config(speculative_json);
    if (!sc.ok()) return fail(sc.message());
    so.scheduler.speculative = *sc;
  }
  std::vector<int32_t>& eos = so.scheduler.eos_token_ids;
  for (int64_t id : c.eos_token_ids) eos.push_back(int32_t(id));
  if (text_mode) {
    for (int32_t id : files.eos_token_ids)
      if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
    // Never sample an id the tokenizer has no token for (muse-tiny's padding rows).
    so.scheduler.sampled_vocab_size = files.tokenizer.id_limit();
    so.tokenizer = files.tokenizer;
  }
  // --dump-logits: every prompt row, in chunks of --max-num-batched-tokens as
  // without it (the engine's logits buffer grows to match).
  if (!o.dump_logits.empty()) so.engine.max_logit_rows = so.scheduler.max_logit_rows = o.max_num_batched_tokens;
  set_log_level(LogLevel::Warn);  // run prints its own summary line
  auto service = server::make_engine_service(std::move(so));

  auto t0 = std::chrono::steady_clock::now();
  if (Status s = service->load({}); !s.ok()) return fail(s.message());
  const double load_s = seconds_since(t0);

  FILE* dump = nullptr;
  if (!o.dump_logits.empty()) {
    dump = std::fopen(o.dump_logits.c_str(), "wb");
    if (!dump) return fail("cannot write --dump-logits file '" + o.dump_logits + "'");
  }
  bool dump_ok = true;

  GenerationRequest req;
  req.id = "run";
  req.prompt = prompt;
  req.sampling.temperature = o.temperature;
  req.sampling.top_k = int(std::min<int64_t>(o.top_k, std::numeric_limits<int>::max()));
  req.sampling.top_p = o.top_p;
  req.sampling.seed = uint64_t(o.seed);
  req.ignore_eos = o.ignore_eos;
  req.max_tokens = o.max_tokens;
  req.skip_special_tokens = o.skip_special_tokens;
  // On the scheduler thread, which then completes the request: done before the sink says so.
  if (dump)
    req.logits_observer = [&](int, std::span<const float> rows) {
      dump_ok = dump_ok && std::fwrite(rows.data(), sizeof(float), rows.size(), dump) == rows.size();
    };
  auto sink = std::make_shared<RunSink>();
  if (auto e = service->submit(std::move(req), sink)) return fail(e->message);

  std::vector<int32_t> out;
  std::string text;
  server::FinishReason finish = server::FinishReason::None;
  server::GenerationSummary summary;
  for (bool done = false; !done;) {
    std::vector<server::GenerationOutput> outputs;
    done = sink->wait(&outputs, &summary);
    for (const auto& d : outputs) {
      out.insert(out.end(), d.token_ids.begin(), d.token_ids.end());
      if (!d.text.empty()) {
        text += d.text;
        if (!o.json) {
          std::fwrite(d.text.data(), 1, d.text.size(), stdout);
          std::fflush(stdout);
        }
      }
      if (d.finish != server::FinishReason::None) finish = d.finish;
    }
  }
  if (dump && std::fclose(dump) != 0) dump_ok = false;
  if (!summary.error.empty()) return fail(summary.error);
  if (finish != server::FinishReason::Stop && finish != server::FinishReason::Length)
    return fail("generation ended without a finish reason");
  if (!dump_ok) return fail("writing --dump-logits failed");
  const std::string finish_name = finish == server::FinishReason::Stop ? "stop" : "length";
  const std::string backend = service->backend_name();
  const double prefill_s = summary.prefill_seconds, decode_s = summary.decode_seconds;
  const int64_t decoded = int64_t(out.size()) - 1;  // tokens fed back through the model

  if (o.json) {
    Json j = Json::object();
    Json arr = Json::array();
    for (int32_t t : out) arr.push_back(int64_t(t));
    j.set("ids", arr);
    j.set("prompt_tokens", int64_t(prompt.size()));
    j.set("generated_tokens", int64_t(out.size()));
    if (text_mode) j.set("text", text);
    j.set("finish_reason", finish_name);
    j.set("backend", backend);
    j.set("load_seconds", load_s);
    j.set("prefill_seconds", prefill_s);
    j.set("prefill_tokens_per_second", double(prompt.size()) / std::max(prefill_s, 1e-9));
    j.set("decode_seconds", decode_s);
    j.set("decode_tokens_per_second", decoded > 0 ? double(decoded) / std::max(decode_s, 1e-9) : 0.0);
    std::printf("%s\n", j.dump().c_str());
  } else {
    if (text_mode) {
      std::printf("\n");
      std::fflush(stdout);
    } else {
      std::string s;
      for (size_t i = 0; i < out.size(); ++i) s += (i ? "," : "") + std::to_string(out[i]);
      std::printf("%s\n", s.c_str());
    }
    std::fprintf(stderr, "muse run: %zu prompt + %zu generated (%s) on %s; prefill %.1f tok/s, decode %.1f tok/s\n",
                 prompt.size(), out.size(), finish_name.c_str(), backend.c_str(),
                 double(prompt.size()) / std::max(prefill_s, 1e-9),
                 decoded > 0 ? double(decoded) / std::max(decode_s, 1e-9) : 0.0);
  }
  return 0;
}

}  // namespace

MUSE_COMMAND("run", "generate text or token ids from a model directory (CPU)", run_command, 10);

}  // namespace muse::tool
