#include "muse/server/api_error.h"

#include "muse/core/json.h"

namespace muse::server {

ApiError invalid_param(std::string param, std::string message, std::string code) {
  ApiError e;
  e.status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

ApiError invalid_type(std::string param, const char* expected, const char* got) {
  std::string msg = "Invalid type for '" + param + "': expected " + expected + ", but got " + got + " instead.";
  return invalid_param(std::move(param), std::move(msg), "invalid_type");
}

ApiError context_length_exceeded(std::string param, int64_t max_model_len, const std::string& what_was_asked,
                                 const std::string& reduce) {
  return invalid_param(std::move(param), "This model's maximum context length is " + std::to_string(max_model_len) +
                                             " tokens. However, " + what_was_asked + ". Please reduce the length of the " +
                                             reduce + ".",
                       "context_length_exceeded");
}

std::string openai_error_body(const ApiError& e) {
  Json err = Json::object();
  err.set("message", e.message);
  err.set("type", e.type);
  err.set("param", e.param.empty() ? Json() : Json(e.param));
  err.set("code", e.code.empty() ? Json() : Json(e.code));
  Json body = Json::object();
  body.set("error", std::move(err));
  return body.dump();
}

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

std::string anthropic_error_body(const ApiError& e) {
  Json err = Json::object();
  err.set("type", anthropic_error_type(e.status));
  err.set("message", e.message);
  Json body = Json::object();
  body.set("type", "error");
  body.set("error", std::move(err));
  return body.dump();
}

}  // namespace muse::server
