// Wire formats of responses: OpenAI chat completions, OpenAI completions,
// OpenAI responses and Anthropic messages, streaming (SSE frames) and whole. The request pipeline
// (generation_handler.cc) feeds per-choice deltas in order; a writer turns
// them into bytes and keeps what a whole response needs.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/server/api_error.h"
#include "muse/server/generation_service.h"

namespace muse::server {

struct ToolCallOut {
  int index = 0;
  std::string id;         // first delta of an index only
  std::string name;       // first delta of an index only
  std::string arguments;  // fragment
};

struct ChoiceDelta {
  std::string text;       // completions: generated text
  std::string reasoning;  // chat/messages
  std::string content;
  std::vector<ToolCallOut> tool_calls;
  std::vector<TokenLogprob> logprobs;
  // completions echo: the prompt text and (optionally) its logprobs, first delta only.
  std::string echo_text;
  std::vector<TokenLogprob> prompt_logprobs;  // first: NaN logprob
  bool empty() const {
    return text.empty() && reasoning.empty() && content.empty() && tool_calls.empty() && logprobs.empty() &&
           echo_text.empty() && prompt_logprobs.empty();
  }
};

struct FinishInfo {
  std::string reason;  // stop, length, tool_calls, abort, error
  Json stop_reason;    // null, the stop string, or the stop token id
};

struct UsageInfo {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
  int reasoning_tokens = 0;
};

enum class ReasoningFields { Both, Reasoning, ReasoningContent };

struct WriterOptions {
  std::string id;             // chatcmpl-…, cmpl-…, msg_…
  std::string model;          // the served name echoed back
  int64_t created = 0;        // unix seconds
  int choices = 1;
  bool include_usage = false;      // stream_options.include_usage (or forced)
  bool continuous_usage = false;
  bool include_reasoning = true;
  ReasoningFields reasoning_fields = ReasoningFields::Both;
  int prompt_tokens = 0;      // for Anthropic's message_start
};

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // Streaming: each returns the SSE bytes to send (possibly empty).
  virtual std::string stream_start() = 0;
  virtual std::string stream_delta(int choice, const ChoiceDelta& delta, const UsageInfo& so_far) = 0;
  virtual std::string stream_finish(int choice, const FinishInfo& finish) = 0;
  virtual std::string stream_end(const UsageInfo& usage) = 0;  // usage, then [DONE] / message_stop
  virtual std::string stream_error(const ApiError& error) = 0;
  virtual std::string keepalive() = 0;
  // Whole response: accumulate, then render.
  virtual void add(int choice, const ChoiceDelta& delta) = 0;
  virtual void finish(int choice, const FinishInfo& finish) = 0;
  virtual std::string body(const UsageInfo& usage) = 0;
};

std::unique_ptr<ResponseWriter> make_chat_writer(const WriterOptions& options);
std::unique_ptr<ResponseWriter> make_completion_writer(const WriterOptions& options);
std::unique_ptr<ResponseWriter> make_messages_writer(const WriterOptions& options);
std::unique_ptr<ResponseWriter> make_responses_writer(const WriterOptions& options);

// "data: <json>\n\n" (and "event: <name>\n" before it when given).
std::string sse_frame(std::string_view json, std::string_view event = {});
// OpenAI logprob entry {"token","logprob","bytes","top_logprobs"}; invalid
// UTF-8 in a token's text is replaced (U+FFFD), the exact bytes go in "bytes".
Json chat_logprob_entry(const TokenLogprob& lp);
// Valid UTF-8 version of s (invalid sequences become U+FFFD).
std::string sanitize_utf8(std::string_view s);

}  // namespace muse::server
