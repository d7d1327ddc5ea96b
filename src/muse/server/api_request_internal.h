// Pieces of request validation shared by api_request.cc (OpenAI) and
// anthropic_request.cc.
#pragma once

#include "muse/server/api_request.h"
#include "muse/server/request_fields.h"

namespace muse::server::detail {

// Every sampling parameter of the three APIs, with the API's ranges (Messages
// reads temperature, top_p and top_k only).
void read_sampling(FieldReader& r, Endpoint api, ApiRequest* out);
// Clears *out and sets what an endpoint starts from (default temperature 1,
// special tokens' text kept outside completions).
void start_request(Endpoint endpoint, const Json& body, ApiRequest* out);
void read_logit_bias(FieldReader& r, const ValidationLimits& limits, ApiRequest* out);
// max_tokens and its aliases: an integer in [lo, 2^31 - 1] (the last one read wins).
void read_max_tokens(FieldReader& r, const char* key, int64_t lo, ApiRequest* out);
void read_stop(FieldReader& r, const ValidationLimits& limits, const char* key, ApiRequest* out);
void read_stop_token_ids(FieldReader& r, const ValidationLimits& limits, ApiRequest* out);
void read_stream(FieldReader& r, ApiRequest* out);
bool valid_tool_name(const std::string& name);
// chat_template_kwargs: reserved names refused, the two flags must be booleans
// (they override *add_generation_prompt / *continue_final). True when it set
// add_generation_prompt.
bool read_template_kwargs(FieldReader& r, bool* add_generation_prompt, bool* continue_final);
// "image", "audio", ... for a content part / block type that carries media; else null.
const char* media_kind(const std::string& type);
ApiError media_refused(const std::string& param, const std::string& type);
// required/named need tools; a named tool must exist (OpenAI or Anthropic shape).
void check_tool_choice(FieldReader& r, ApiRequest* out);

}  // namespace muse::server::detail
