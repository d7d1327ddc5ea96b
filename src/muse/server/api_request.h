// Validation of OpenAI (chat, completions, responses) and Anthropic
// (messages) request bodies into one typed request, whose engine part is the
// GenerationRequest the scheduler runs (engine/generation_request.h). Every
// parameter docs/server.md lists is checked for type and range here, once; a
// failure is an ApiError naming the parameter (400), never a crash.
// Model-dependent checks (prompt length, served names, capabilities) happen
// later, in admission (generation_job.cc).
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "muse/core/json.h"
#include "muse/server/api_error.h"
#include "muse/server/generation_service.h"

namespace muse::server {

enum class Endpoint { ChatCompletions, Completions, Messages, Responses };

struct ToolChoice {
  enum class Kind { Auto, None, Required, Named } kind = Kind::Auto;
  std::string name;  // Named
};

// A prompt of /v1/completions: text or token ids.
using CompletionPrompt = std::variant<std::string, std::vector<int32_t>>;

// Which model-dependent sampling fields the request set itself; the others
// take generation_config.json's values (serve's --generation-config auto).
struct SamplingGiven {
  bool temperature = false, top_p = false, top_k = false, min_p = false, repetition_penalty = false;
};

// A validated request: what the wire format says (kept by the GenerationJob
// to write the response) and `generation`, the engine request the validators
// fill directly. Admission gives each prompt its own copy of `generation`
// with the prompt ids and the resolved max_tokens, and moves it to the engine.
struct ApiRequest {
  Endpoint endpoint = Endpoint::ChatCompletions;
  Json body;                 // the request as sent (rendering reads it)
  std::string model;         // empty: not given (the served model)
  bool stream = false;
  bool include_usage = false;        // stream_options.include_usage
  bool continuous_usage = false;     // stream_options.continuous_usage_stats (vLLM)
  std::optional<int64_t> max_tokens; // max_completion_tokens wins over max_tokens; absent: the rest of the context
  GenerationRequest generation;      // n, sampling, stop strings and ids, logprobs, skip_special_tokens
  SamplingGiven sampling_given;
  bool echo = false;                 // completions
  bool include_reasoning = true;     // vLLM's include_reasoning
  // Tools (chat and messages).
  Json tools;                        // null or the non-empty array as sent
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
  Json response_format;              // null or {"type":...}
  std::vector<CompletionPrompt> prompts;  // completions only
};

struct ValidationLimits {
  int vocab_size = 0;      // 0: token ids unchecked
  int max_logprobs = 20;   // --max-logprobs
  int max_n = 128;
  int max_stop = 64;       // stop strings per request
  int max_model_len = 0;   // 0: unchecked; else token-id prompts this long are refused early
};

// Each returns the first problem found, or nullopt with *out filled.
std::optional<ApiError> parse_chat_request(const Json& body, const ValidationLimits& limits, ApiRequest* out);
std::optional<ApiError> parse_completion_request(const Json& body, const ValidationLimits& limits, ApiRequest* out);
std::optional<ApiError> parse_messages_request(const Json& body, const ValidationLimits& limits, ApiRequest* out);
// /v1/responses: converted to the equivalent chat request (`out->body` is
// that chat body), endpoint Responses.
std::optional<ApiError> parse_responses_request(const Json& body, const ValidationLimits& limits, ApiRequest* out);

// Parses the body bytes: 400 for malformed JSON or invalid UTF-8, or a body
// that is not a JSON object.
std::optional<ApiError> parse_json_body(std::string_view bytes, Json* out);

}  // namespace muse::server
