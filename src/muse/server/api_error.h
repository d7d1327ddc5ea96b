// Errors as clients see them: an HTTP status plus the OpenAI envelope
// {"error":{"message","type","param","code"}} (code always a string), or the
// Anthropic one {"type":"error","error":{"type","message"}} on /v1/messages.
#pragma once

#include <cstdint>
#include <string>

namespace muse::server {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // empty: null
  std::string code;   // a string; empty only where no code fits (then null)
};

// 400 naming the parameter. `code` e.g. invalid_type, invalid_value.
ApiError invalid_param(std::string param, std::string message, std::string code = "invalid_value");
ApiError invalid_type(std::string param, const char* expected, const char* got);
// The prompt does not fit the context (400, context_length_exceeded), in
// OpenAI's wording: "This model's maximum context length is N tokens.
// However, <what_was_asked>. Please reduce the length of the <reduce>."
// The one wording of every context check (validation and admission).
ApiError context_length_exceeded(std::string param, int64_t max_model_len, const std::string& what_was_asked,
                                 const std::string& reduce);

std::string openai_error_body(const ApiError& e);
std::string anthropic_error_body(const ApiError& e);
// Anthropic's error type for a status (invalid_request_error, not_found_error, …).
const char* anthropic_error_type(int status);

}  // namespace muse::server
