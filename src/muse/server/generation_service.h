// What the HTTP server needs from the rest of muse, as two small interfaces:
//
//   ModelAdapter       tokenizer + chat template + response parser (tokenizer/,
//                      chat/): request JSON -> prompt ids; generated ids/text ->
//                      reasoning, content and tool-call deltas.
//   GenerationService  the engine (engine/, sampling/, kv/): a GenerationRequest
//                      (prompt ids, sampling, stop conditions) -> a stream of
//                      token/text deltas per choice, cancellable at any time.
//
// The server owns HTTP, validation, wire formats and metrics; it never touches
// tensors. Threading contract: the server calls these from its I/O thread;
// GenerationSink methods are called from the service's own thread(s) and must
// only enqueue (the server's sink does: a mutex-protected append and a wake-up).
// tests/support/fake_model/ implements both deterministically for tests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/engine/generation_request.h"

namespace muse::server {

// Requests to the engine are GenerationRequests (engine/generation_request.h):
// one value from the API validators through submit() to the scheduler.

// ---------------------------------------------------------------------------
// Events from the engine
// ---------------------------------------------------------------------------

enum class FinishReason { None, Stop, Length, Abort, Error };

struct TopLogprob {
  int32_t token_id = 0;
  std::string token;  // the token's text (bytes may be partial UTF-8)
  double logprob = 0;
};

struct TokenLogprob {
  int32_t token_id = 0;
  std::string token;
  double logprob = 0;
  std::vector<TopLogprob> top;  // best first; size = requested k
};

// One delivery for one choice: everything new since the previous delivery.
struct GenerationOutput {
  int index = 0;                      // choice 0..n-1
  std::vector<int32_t> token_ids;     // new tokens
  std::string text;                   // their text: whole UTF-8 characters only,
                                      // stop strings already cut (never leaked)
  std::vector<TokenLogprob> logprobs; // one per new token when requested
  // First delivery only, when prompt_logprobs >= 0: one per prompt token; the
  // first token has no logprob (NaN, sent as null) and an empty `top`.
  std::vector<TokenLogprob> prompt_logprobs;
  FinishReason finish = FinishReason::None;  // set on the last delivery of this choice
  // Why it stopped when finish == Stop: the matched stop string, or the stop
  // token id, or neither (EOS). Reported as `stop_reason` / `stop_sequence`.
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
};

struct GenerationSummary {
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;          // served from the prefix cache
  std::vector<int> completion_tokens;    // per choice
  // Seconds, measured by the engine (for the vLLM-style histograms).
  double queue_seconds = 0;              // arrival -> first scheduled
  double prefill_seconds = 0;            // first scheduled -> first token
  double decode_seconds = 0;             // first token -> last token
  std::string error;                     // non-empty: the engine failed this request
};

// Receives one request's events. Called from the service's thread(s); every
// method must return quickly (enqueue only). on_complete is called exactly
// once, after the last on_output, also after cancel() (with Abort finishes).
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void on_output(GenerationOutput output) = 0;
  virtual void on_complete(GenerationSummary summary) = 0;
};

// Why submit() refused a request; maps to an HTTP status.
struct SubmitError {
  enum class Kind { Invalid, Overloaded, Unavailable } kind = Kind::Invalid;
  std::string message;
};

// Live engine figures for /metrics.
struct EngineStats {
  int num_requests_running = 0;
  int num_requests_waiting = 0;
  double kv_cache_usage = 0;  // 0..1
  uint64_t prefix_cache_queries = 0;  // tokens looked up
  uint64_t prefix_cache_hits = 0;     // tokens found
  // Engine loop figures (zero for engines without a step loop).
  uint64_t num_preemptions = 0;       // sequences preempted (KV cache full), recomputed later
  uint64_t engine_steps = 0;          // model steps run
  double engine_busy_seconds = 0;     // scheduler iterations with work, end to end
  double engine_model_seconds = 0;    // of which inside the model's forward step
  // Speculative decoding (vLLM's spec_decode counters); rendered only when on.
  bool spec_decode = false;
  uint64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  std::vector<uint64_t> spec_accepted_per_pos;  // [k]
};

// Model loading progress, reported by the loader as it goes.
struct LoadProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
  uint64_t tensors_done = 0, tensors_total = 0;
};
using LoadProgressFn = std::function<void(const LoadProgress&)>;

class GenerationService {
 public:
  virtual ~GenerationService() = default;
  // Loads weights and allocates caches; blocks; called once on a loader thread
  // while the HTTP server already answers (/health is 503 until it returns).
  virtual Status load(const LoadProgressFn& progress) = 0;
  // Queues a request (moved on to the scheduler). Outputs arrive on `sink`.
  // An error here means nothing was queued and the sink will never be called.
  virtual std::optional<SubmitError> submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) = 0;
  // Stops a request as soon as possible (within one engine step). Unknown or
  // finished ids are ignored. The sink still gets on_complete.
  virtual void cancel(const std::string& request_id) = 0;
  virtual EngineStats stats() const = 0;
};

// ---------------------------------------------------------------------------
// Tokenizer, chat template and response parsing
// ---------------------------------------------------------------------------

struct ModelInfo {
  int max_model_len = 4096;            // context window actually served
  int vocab_size = 0;                  // for logit_bias / token id checks
  std::vector<int32_t> eos_token_ids;  // from generation_config.json
  // Sampling defaults from generation_config.json (absent fields: unset).
  Json default_sampling;               // e.g. {"temperature":0.6,"top_p":0.95}
  bool supports_structured_output = false;  // response_format json_*
  bool supports_forced_tool_choice = false; // tool_choice required/named
  bool supports_prompt_logprobs = false;    // completions echo + logprobs
  // The longest token's text in bytes (0: unknown). A text longer than
  // 2 x max_model_len x this cannot fit the context, whatever it says, so it
  // is refused without being tokenized.
  int max_token_bytes = 0;
};

enum class ChatApi { OpenAI, Anthropic };

struct RenderedPrompt {
  std::string text;
  std::vector<int32_t> ids;
  // Not tokenized: the text is too long for the context (max_token_bytes).
  bool exceeds_context = false;
};

// A text certainly longer than the context (see ModelInfo::max_token_bytes).
inline bool exceeds_context(const ModelInfo& info, size_t text_bytes) {
  return info.max_token_bytes > 0 && double(text_bytes) > 2.0 * double(info.max_model_len) * double(info.max_token_bytes);
}

// Incremental delta from the response parser.
struct ToolCallDelta {
  int index = 0;          // 0, 1, ... in order of appearance
  std::string name;       // non-empty on the first delta of an index only
  std::string arguments;  // a fragment of the JSON-encoded arguments object
};

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  int reasoning_tokens = 0;  // how many of the fed tokens were reasoning
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Splits one choice's output into reasoning / content / tool calls. Fed in
// order with what GenerationOutput delivered (ids and their text, special
// tokens included); holds back anything that might still become a marker.
// For a finished call the concatenated `arguments` fragments are a JSON object.
class OutputParser {
 public:
  virtual ~OutputParser() = default;
  virtual void feed(std::span<const int32_t> token_ids, std::string_view text, ParsedDelta& out) = 0;
  // End of generation (why: Stop, Length, Abort or Error): flush held-back
  // text, close what is open; a call cut by Length may be dropped.
  virtual void finish(FinishReason why, ParsedDelta& out) = 0;
};

struct ParserOptions {
  bool tools_enabled = false;  // false: tool-call syntax stays content
  Json tools;                  // the request's tools (schemas, for value decoding)
};

class ModelAdapter {
 public:
  virtual ~ModelAdapter() = default;
  virtual const ModelInfo& info() const = 0;
  virtual Result<std::vector<int32_t>> tokenize(std::string_view text, bool add_special_tokens) const = 0;
  virtual Result<std::string> detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;
  // `request` is the validated request body (OpenAI chat or Anthropic
  // messages, as `api` says) with server-side normalisation applied: tool
  // calls' JSON-string arguments left as sent, `reasoning_effort` (OpenAI) or
  // `output_config.effort` (Anthropic) as sent, `chat_template_kwargs` as sent.
  // The adapter maps effort to the template's reasoning_strength, content
  // parts to template parts, and renders + tokenizes without adding special
  // tokens. Errors are the client's fault (HTTP 400, message passed through).
  virtual Result<RenderedPrompt> render_chat(const Json& request, ChatApi api) const = 0;
  virtual std::unique_ptr<OutputParser> make_output_parser(const ParserOptions& options) const = 0;
};

// Both halves plus a name for logs; what `muse serve` runs.
struct ServeBackend {
  std::shared_ptr<ModelAdapter> adapter;
  std::shared_ptr<GenerationService> service;
};

}  // namespace muse::server
