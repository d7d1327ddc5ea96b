// Request rendering: an OpenAI chat-completions (or Anthropic messages)
// request -> the chat template's inputs -> the prompt text, the same way
// for `muse render` and the server. The prompt is tokenized afterwards
// without adding special tokens (the template writes BOS itself).
//
// What changes on the way (chat-format.md requirements 4-8, vLLM's
// behaviour where the spec is silent):
//  - tool-call `arguments` given as JSON strings become mappings;
//  - content parts map to the template's part types (image_url -> image,
//    video_url -> video, ...); Muse profiles refuse types they cannot render;
//  - `reasoning` is accepted as `reasoning_content`; roles are renamed per
//    profile (developer -> system for Glimmer);
//  - `reasoning_effort` (or Responses' reasoning.effort) becomes the
//    profile's kwarg (reasoning_strength), unless chat_template_kwargs sets it;
//  - chat_template_kwargs pass through; tools are validated.
// Every malformed input is an error naming the field ("messages[2].role ...").
#pragma once

#include <string>
#include <vector>

#include "muse/chat/chat_template.h"
#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse::chat {

enum class RequestApi { OpenAIChat, AnthropicMessages };

struct ChatRenderOptions {
  RequestApi api = RequestApi::OpenAIChat;
  jinja::RenderOptions render;  // limits and clock
};

struct ChatPrompt {
  std::string text;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

// The variables the template sees: messages, tools, documents,
// add_generation_prompt, the special tokens, then chat_template_kwargs.
Result<Json> build_template_context(const Json& request, const ChatTemplate& tpl, const ChatRenderOptions& options = {});

// The prompt text for a request. Errors are client errors (HTTP 400).
Result<ChatPrompt> render_chat(const Json& request, const ChatTemplate& tpl, const ChatRenderOptions& options = {});
Result<std::string> render_chat_prompt(const Json& request, const ChatTemplate& tpl,
                                       const ChatRenderOptions& options = {});

// An Anthropic messages request rewritten as an OpenAI chat request (system
// -> system message, tool_use -> tool_calls, tool_result -> tool messages,
// thinking -> reasoning_content, input_schema -> parameters).
Result<Json> anthropic_to_openai(const Json& request);

}  // namespace muse::chat
