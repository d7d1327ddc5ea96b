#include "muse/server/server_context.h"

#include <random>

#include "muse/core/log.h"

namespace muse::server {

namespace {
bool is_messages_path(std::string_view path) { return path.starts_with("/v1/messages"); }
}  // namespace

ValidationLimits ServerContext::limits() const {
  ValidationLimits l;
  l.vocab_size = backend.adapter->info().vocab_size;
  l.max_logprobs = opt.max_logprobs;
  l.max_model_len = backend.adapter->info().max_model_len;
  return l;
}

HttpResponse ServerContext::error_response(const ApiError& e, std::string_view path) const {
  HttpResponse r;
  r.status = e.status;
  r.body = is_messages_path(path) ? anthropic_error_body(e) : openai_error_body(e);
  if (e.status == 429 || e.status == 503) r.headers.emplace_back("Retry-After", "1");
  if (e.status == 401 && !is_messages_path(path)) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

void ServerContext::respond_error(HttpExchange& ex, const ApiError& e) const { ex.respond(error_response(e, ex.request().path)); }

void internal_error(const ServerContext& ctx, HttpExchange& ex, const char* what) {
  const HttpRequest& req = ex.request();
  LOG_ERROR("internal error while handling %s %s from %s (request #%llu): %s; answered 500, server continues",
            req.method.c_str(), req.path.c_str(), req.remote.c_str(), static_cast<unsigned long long>(req.id), what);
  if (ex.finished()) return;
  ctx.respond_error(ex, ApiError{500, "server_error", "Internal server error while handling this request (it has been logged).",
                                 "", "internal_error"});
  ex.end_stream();  // a stream already started cannot change its status: end it
}

std::string random_id(const char* prefix, size_t length) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char kChars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string id = prefix;
  for (size_t i = 0; i < length; ++i) id.push_back(kChars[rng() % 62]);
  return id;
}

}  // namespace muse::server
