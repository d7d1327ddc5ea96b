// Pieces of request validation shared by api_request.cc (OpenAI) and
// anthropic_request.cc.
#pragma once

#include "muse/server/api_request.h"
#include "muse/server/request_fields.h"

namespace muse::server::detail {

void read_sampling(FieldReader& r, ApiRequest* out);
void read_logit_bias(FieldReader& r, const ValidationLimits& limits, ApiRequest* out);
void read_stop(FieldReader& r, const ValidationLimits& limits, const char* key, ApiRequest* out);
void read_stop_token_ids(FieldReader& r, const ValidationLimits& limits, ApiRequest* out);
void read_stream(FieldReader& r, ApiRequest* out);
bool valid_tool_name(const std::string& name);
// required/named need tools; a named tool must exist (OpenAI or Anthropic shape).
void check_tool_choice(FieldReader& r, ApiRequest* out);

}  // namespace muse::server::detail
