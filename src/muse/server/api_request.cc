// OpenAI request validation (chat completions and completions).
#include "muse/server/api_request.h"

#include <algorithm>
#include <limits>

#include "muse/server/api_request_internal.h"
#include "muse/server/request_fields.h"

namespace muse::server {

namespace {
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
}

std::optional<ApiError> parse_json_body(std::string_view bytes, Json* out) {
  if (size_t bad = find_invalid_utf8(bytes); bad != std::string_view::npos) {
    ApiError e = invalid_param("", "The request body is not valid UTF-8 (invalid byte sequence at offset " +
                                       std::to_string(bad) + ").", "invalid_encoding");
    return e;
  }
  JsonParseOptions options;
  options.max_depth = 128;
  auto parsed = Json::parse(bytes, options);
  if (!parsed.ok())
    return invalid_param("", "We could not parse the JSON body of your request: " + parsed.message() +
                                 ". The body must be a JSON object.", "invalid_json");
  if (!parsed->is_object())
    return invalid_param("", std::string("The request body must be a JSON object, got ") + FieldReader::json_kind(*parsed) + ".",
                         "invalid_json");
  *out = std::move(parsed).value();
  return std::nullopt;
}

namespace detail {

void read_sampling(FieldReader& r, Endpoint api, ApiRequest* out) {
  SamplingConfig& s = out->generation.sampling;
  SamplingGiven& given = out->sampling_given;
  const bool anthropic = api == Endpoint::Messages;  // Anthropic's ranges: temperature <= 1, top_k >= 0
  given.temperature = r.number("temperature", &s.temperature, 0, anthropic ? 1 : 2);
  given.top_p = r.number("top_p", &s.top_p, 0, 1, /*lo_open=*/true);
  int64_t top_k = 0;
  if (r.integer("top_k", &top_k, anthropic ? 0 : -1, kMaxInt32)) {
    s.top_k = top_k < 0 ? 0 : top_k;  // vLLM: -1 and 0 both mean off
    given.top_k = true;
  }
  if (anthropic) return;  // Messages has no other sampling parameters
  given.min_p = r.number("min_p", &s.min_p, 0, 1);
  r.number("presence_penalty", &s.presence_penalty, -2, 2);
  r.number("frequency_penalty", &s.frequency_penalty, -2, 2);
  given.repetition_penalty = r.number("repetition_penalty", &s.repetition_penalty, 0, 100, /*lo_open=*/true);
  int64_t seed = 0;
  if (r.integer("seed", &seed, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    s.seed = uint64_t(seed);  // a negative seed keeps its bits
  r.boolean("ignore_eos", &out->generation.ignore_eos);
  r.integer("min_tokens", &s.min_tokens, 0, kMaxInt32);
}

void read_logit_bias(FieldReader& r, const ValidationLimits& limits, ApiRequest* out) {
  const Json* bias = r.typed("logit_bias", Json::Type::Object, "an object");
  if (!bias) return;
  for (const auto& [key, value] : bias->as_object()) {
    int64_t id = -1;
    bool digits = !key.empty() && key.size() <= 10 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) id = std::stoll(key);
    if (!digits || id > kMaxInt32 || (limits.vocab_size > 0 && id >= limits.vocab_size)) {
      r.fail(invalid_param("logit_bias", "Invalid key in 'logit_bias': '" + key + "' is not a token id in [0, " +
                                             std::to_string(limits.vocab_size) + ")."));
      return;
    }
    if (!value.is_number() || value.as_double() < -100 || value.as_double() > 100) {
      r.fail(invalid_param("logit_bias", "Invalid value in 'logit_bias' for token " + key + ": expected a number in [-100, 100]."));
      return;
    }
    out->generation.sampling.logit_bias.emplace_back(int32_t(id), float(value.as_double()));
  }
}

void read_stop(FieldReader& r, const ValidationLimits& limits, const char* key, ApiRequest* out) {
  const Json* stop = r.get(key);
  if (!stop || r.failed()) return;
  auto add = [&](const Json& s) {
    if (!s.is_string()) return r.fail(invalid_type(key, "a string or an array of strings", FieldReader::json_kind(s)));
    if (s.as_string().empty()) return r.fail(invalid_param(key, std::string("Invalid '") + key + "': stop strings must not be empty."));
    out->generation.stop_strings.push_back(s.as_string());
    return true;
  };
  if (stop->is_string()) {
    add(*stop);
  } else if (stop->is_array()) {
    if (int(stop->size()) > limits.max_stop)
      r.fail(invalid_param(key, std::string("Invalid '") + key + "': at most " + std::to_string(limits.max_stop) + " stop strings."));
    for (const auto& s : stop->as_array())
      if (!add(s)) break;
  } else {
    r.fail(invalid_type(key, "a string or an array of strings", FieldReader::json_kind(*stop)));
  }
}

void read_stop_token_ids(FieldReader& r, const ValidationLimits& limits, ApiRequest* out) {
  const Json* ids = r.typed("stop_token_ids", Json::Type::Array, "an array of integers");
  if (!ids) return;
  for (const auto& v : ids->as_array()) {
    if (!v.is_int() || v.as_int() < 0 || v.as_int() > kMaxInt32 || (limits.vocab_size > 0 && v.as_int() >= limits.vocab_size)) {
      r.fail(invalid_param("stop_token_ids", "Invalid 'stop_token_ids': each must be a token id in [0, " +
                                                 std::to_string(limits.vocab_size) + ")."));
      return;
    }
    out->generation.stop_token_ids.push_back(int32_t(v.as_int()));
  }
}

void read_stream(FieldReader& r, ApiRequest* out) {
  r.boolean("stream", &out->stream);
  const Json* opts = r.typed("stream_options", Json::Type::Object, "an object");
  if (!opts) return;
  if (!out->stream) {
    r.fail(invalid_param("stream_options", "Invalid 'stream_options': only allowed when 'stream' is true."));
    return;
  }
  FieldReader o(*opts);
  o.boolean("include_usage", &out->include_usage);
  o.boolean("continuous_usage_stats", &out->continuous_usage);
  if (o.error) {
    o.error->param = "stream_options." + o.error->param;
    r.fail(*o.error);
  }
}

// chat_template_kwargs: passed to the template as given, except the context
// variables the request supplies itself (their types are relied on after
// rendering) and the two flags, which must be booleans. Returns whether
// add_generation_prompt was given there.
bool read_template_kwargs(FieldReader& r, bool* add_generation_prompt, bool* continue_final) {
  const Json* kw = r.typed("chat_template_kwargs", Json::Type::Object, "an object");
  if (!kw) return false;
  bool add_given = false;
  for (const auto& [name, value] : kw->as_object()) {
    const std::string param = "chat_template_kwargs." + name;
    if (name == "messages" || name == "tools" || name == "documents") {
      r.fail(invalid_param(param, "Invalid '" + param + "': the template's '" + name +
                                      "' comes from the request itself and cannot be replaced here."));
      return false;
    }
    if (name == "add_generation_prompt" || name == "continue_final_message") {
      if (!value.is_bool()) {
        r.fail(invalid_type(param, "a boolean", FieldReader::json_kind(value)));
        return false;
      }
      if (name == "add_generation_prompt") {
        *add_generation_prompt = value.as_bool();
        add_given = true;
      } else {
        *continue_final = value.as_bool();
      }
    }
  }
  return add_given;
}

const char* media_kind(const std::string& type) {
  static const char* kMedia[][2] = {{"image_url", "image"}, {"image", "image"},     {"input_image", "image"},
                                    {"video_url", "video"}, {"video", "video"},     {"input_audio", "audio"},
                                    {"audio_url", "audio"}, {"audio", "audio"},     {"file", "file"},
                                    {"input_file", "file"}, {"document", "document"}};
  for (const auto& m : kMedia)
    if (type == m[0]) return m[1];
  return nullptr;
}

ApiError media_refused(const std::string& param, const std::string& type) {
  // As vLLM does for text-only models: answering about an input the model
  // never saw would be worse than refusing it.
  return invalid_param(param, "Invalid '" + param + "': " + media_kind(type) + " input ('" + type +
                                  "') is not supported; this server takes text only.", "unsupported_value");
}

bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
  });
}

}  // namespace detail

namespace {

using namespace detail;

void read_tools(FieldReader& r, ApiRequest* out) {
  const Json* tools = r.typed("tools", Json::Type::Array, "an array");
  if (tools) {
    for (size_t i = 0; i < tools->size() && !r.failed(); ++i) {
      const Json& t = tools->as_array()[i];
      std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) { r.fail(invalid_type(where, "an object", FieldReader::json_kind(t))); break; }
      std::string type = t.get_string("type", "");
      if (type != "function") {
        r.fail(invalid_param(where + ".type", "Invalid '" + where + ".type': only \"function\" tools are supported, got \"" + type + "\"."));
        break;
      }
      const Json* fn = t.find("function");
      if (!fn || !fn->is_object()) { r.fail(invalid_param(where + ".function", "Missing required parameter: '" + where + ".function'.", "missing_required_parameter")); break; }
      const Json* name = fn->find("name");
      if (!name || !name->is_string() || !valid_tool_name(name->as_string())) {
        r.fail(invalid_param(where + ".function.name", "Invalid '" + where + ".function.name': a tool name must match [A-Za-z0-9_.-]{1,128}."));
        break;
      }
      if (const Json* d = fn->find("description"); d && !d->is_null() && !d->is_string()) {
        r.fail(invalid_type(where + ".function.description", "a string", FieldReader::json_kind(*d)));
        break;
      }
      if (const Json* p = fn->find("parameters"); p && !p->is_null() && !p->is_object()) {
        r.fail(invalid_type(where + ".function.parameters", "an object (a JSON schema)", FieldReader::json_kind(*p)));
        break;
      }
    }
    if (!tools->as_array().empty()) out->tools = *tools;
  }
  if (const Json* tc = r.get("tool_choice"); tc && !r.failed()) {
    auto& choice = out->tool_choice;
    if (tc->is_string()) {
      const std::string& s = tc->as_string();
      if (s == "auto") choice.kind = ToolChoice::Kind::Auto;
      else if (s == "none") choice.kind = ToolChoice::Kind::None;
      else if (s == "required") choice.kind = ToolChoice::Kind::Required;
      else r.fail(invalid_param("tool_choice", "Invalid 'tool_choice': expected \"none\", \"auto\", \"required\" or a named function, got \"" + s + "\"."));
    } else if (tc->is_object() && tc->get_string("type", "") == "function" && tc->find("function") &&
               tc->find("function")->find("name") && tc->find("function")->find("name")->is_string()) {
      choice.kind = ToolChoice::Kind::Named;
      choice.name = tc->find("function")->find("name")->as_string();
    } else {
      r.fail(invalid_param("tool_choice", "Invalid 'tool_choice': an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}."));
    }
  } else if (out->tools.is_null() && !r.failed()) {
    out->tool_choice.kind = ToolChoice::Kind::None;
  }
  r.boolean("parallel_tool_calls", &out->parallel_tool_calls);
  if (r.failed()) return;
  check_tool_choice(r, out);
}

void read_response_format(FieldReader& r, ApiRequest* out) {
  const Json* rf = r.typed("response_format", Json::Type::Object, "an object");
  if (!rf) return;
  std::string type = rf->get_string("type", "");
  if (type == "text") return;
  if (type == "json_object") {
    out->response_format = *rf;
    return;
  }
  if (type == "json_schema") {
    const Json* js = rf->find("json_schema");
    if (!js || !js->is_object() || !js->find("schema") || !js->find("schema")->is_object()) {
      r.fail(invalid_param("response_format.json_schema", "Invalid 'response_format': type json_schema needs 'json_schema' with an object 'schema'."));
      return;
    }
    out->response_format = *rf;
    return;
  }
  r.fail(invalid_param("response_format.type", "Invalid 'response_format.type': expected \"text\", \"json_object\" or \"json_schema\", got \"" + type + "\"."));
}

// Parameters we know but do not implement are refused rather than ignored
// when ignoring them would change the answer.
void refuse_unsupported(FieldReader& r, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (r.get(k) && !r.failed())
      r.fail(invalid_param(k, std::string("Parameter '") + k + "' is not supported by this server.", "unsupported_parameter"));
}

}  // namespace

void detail::read_max_tokens(FieldReader& r, const char* key, int64_t lo, ApiRequest* out) {
  int64_t v = 0;
  if (r.integer(key, &v, lo, kMaxInt32)) out->max_tokens = v;
}

// What every API starts from before the body is read: the OpenAI and
// Anthropic default temperature is 1; only completions return special
// tokens' text as asked (chat output goes through the response parser,
// which needs the framing).
void detail::start_request(Endpoint endpoint, const Json& body, ApiRequest* out) {
  *out = ApiRequest{};
  out->endpoint = endpoint;
  out->body = body;
  out->generation.sampling.temperature = 1.0;
  out->generation.skip_special_tokens = endpoint == Endpoint::Completions;
  if (endpoint == Endpoint::Completions) out->tool_choice.kind = ToolChoice::Kind::None;
}

void detail::check_tool_choice(FieldReader& r, ApiRequest* out) {
  auto& choice = out->tool_choice;
  bool has_tools = !out->tools.is_null();
  if ((choice.kind == ToolChoice::Kind::Required || choice.kind == ToolChoice::Kind::Named) && !has_tools) {
    r.fail(invalid_param("tool_choice", "Invalid 'tool_choice': \"" + std::string(choice.kind == ToolChoice::Kind::Required ? "required" : choice.name) +
                                            "\" needs a non-empty 'tools' list."));
    return;
  }
  if (choice.kind == ToolChoice::Kind::Named) {
    bool found = false;
    for (const auto& t : out->tools.as_array()) {
      const Json* fn = t.find("function");
      if (!fn) fn = &t;  // Anthropic tools are flat
      if (fn->get_string("name", "") == choice.name) found = true;
    }
    if (!found) r.fail(invalid_param("tool_choice", "Invalid 'tool_choice': no tool named \"" + choice.name + "\" in 'tools'."));
  }
}

std::optional<ApiError> parse_chat_request(const Json& body, const ValidationLimits& limits, ApiRequest* out) {
  start_request(Endpoint::ChatCompletions, body, out);
  FieldReader r(body);
  r.string("model", &out->model);
  const Json* messages = r.get("messages");
  if (!messages && !r.failed())
    return invalid_param("messages", "Missing required parameter: 'messages'.", "missing_required_parameter");
  if (messages && !messages->is_array()) return invalid_type("messages", "an array", FieldReader::json_kind(*messages));
  if (messages && messages->as_array().empty()) return invalid_param("messages", "Invalid 'messages': empty array. Expected at least one message.");
  if (messages) {
    for (size_t i = 0; i < messages->size(); ++i) {
      const Json& m = messages->as_array()[i];
      std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return invalid_type(where, "an object", FieldReader::json_kind(m));
      const Json* role = m.find("role");
      if (!role || !role->is_string()) return invalid_param(where + ".role", "Invalid '" + where + ".role': expected a string.");
      static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
      if (std::none_of(std::begin(kRoles), std::end(kRoles), [&](const char* k) { return role->as_string() == k; }))
        return invalid_param(where + ".role", "Invalid '" + where + ".role': expected one of system, developer, user, "
                                              "assistant, tool; got \"" + role->as_string() + "\".");
      const Json* content = m.find("content");
      if (content && !content->is_null() && !content->is_string() && !content->is_array())
        return invalid_type(where + ".content", "a string, an array of content parts or null", FieldReader::json_kind(*content));
      if (content && content->is_array())
        for (size_t j = 0; j < content->size(); ++j) {
          const Json& part = content->as_array()[j];
          if (!part.is_object() || !part.find("type") || !part.find("type")->is_string())
            return invalid_param(where + ".content", "Invalid '" + where + ".content': each part must be an object with a string 'type'.");
          const std::string& type = part.find("type")->as_string();
          if (media_kind(type)) return media_refused(where + ".content[" + std::to_string(j) + "]", type);
        }
      if (const Json* calls = m.find("tool_calls"); calls && !calls->is_null()) {
        if (!calls->is_array()) return invalid_type(where + ".tool_calls", "an array", FieldReader::json_kind(*calls));
        for (const auto& c : calls->as_array())
          if (!c.is_object() || !c.find("function") || !c.find("function")->is_object())
            return invalid_param(where + ".tool_calls", "Invalid '" + where + ".tool_calls': each call needs a 'function' object.");
      }
    }
  }
  read_stream(r, out);
  int64_t n = 1;
  if (r.integer("n", &n, 1, limits.max_n)) out->generation.n = int(n);
  read_max_tokens(r, "max_tokens", 1, out);
  read_max_tokens(r, "max_completion_tokens", 1, out);  // read second: it wins
  read_sampling(r, Endpoint::ChatCompletions, out);
  read_logit_bias(r, limits, out);
  read_stop(r, limits, "stop", out);
  read_stop_token_ids(r, limits, out);
  r.boolean("include_stop_str_in_output", &out->generation.include_stop_str_in_output);
  bool logprobs = false;
  r.boolean("logprobs", &logprobs);
  int64_t top = 0;
  bool has_top = r.integer("top_logprobs", &top, 0, limits.max_logprobs);
  if (has_top && !logprobs && !r.failed())
    r.fail(invalid_param("top_logprobs", "Invalid 'top_logprobs': requires 'logprobs' to be true."));
  if (logprobs) out->generation.logprobs = int(top);
  bool skip_special_tokens = true;  // checked, then unused: chat output keeps the framing (start_request)
  r.boolean("skip_special_tokens", &skip_special_tokens);
  r.boolean("include_reasoning", &out->include_reasoning);
  std::string effort;
  if (r.string("reasoning_effort", &effort)) {
    static const char* kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
    if (std::none_of(std::begin(kEfforts), std::end(kEfforts), [&](const char* e) { return effort == e; }))
      r.fail(invalid_param("reasoning_effort", "Invalid 'reasoning_effort': expected one of none, minimal, low, medium, high, xhigh, max; got \"" + effort + "\"."));
  }
  bool add_generation_prompt = true, continue_final = false;
  bool add_given = r.boolean("add_generation_prompt", &add_generation_prompt);
  r.boolean("continue_final_message", &continue_final);
  add_given |= read_template_kwargs(r, &add_generation_prompt, &continue_final);
  if (add_generation_prompt && continue_final && !r.failed() && add_given)
    r.fail(invalid_param("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true."));
  read_tools(r, out);
  read_response_format(r, out);
  std::string user;
  r.string("user", &user);
  if (r.get("chat_template") && !r.failed())
    r.fail(invalid_param("chat_template", "A per-request 'chat_template' is not accepted; the server uses the model's template (or --chat-template).",
                         "unsupported_parameter"));
  refuse_unsupported(r, {"functions", "function_call", "audio", "prediction", "web_search_options"});
  if (const Json* mod = r.get("modalities"); mod && mod->is_array() && !r.failed())
    for (const auto& m : mod->as_array())
      if (!(m.is_string() && m.as_string() == "text"))
        r.fail(invalid_param("modalities", "Invalid 'modalities': only [\"text\"] output is supported.", "unsupported_value"));
  return r.error;
}

std::optional<ApiError> parse_completion_request(const Json& body, const ValidationLimits& limits, ApiRequest* out) {
  start_request(Endpoint::Completions, body, out);
  FieldReader r(body);
  r.string("model", &out->model);
  const Json* prompt = r.get("prompt");
  if (!prompt && !r.failed()) return invalid_param("prompt", "Missing required parameter: 'prompt'.", "missing_required_parameter");
  // Errors name the element that is wrong (prompt[2], prompt[0][5]), so a
  // client holding a batch of prompts can find it.
  auto bad_prompt = [](const std::string& where, const Json& v) {
    return invalid_param(where, "Invalid '" + where + "': expected a string, an array of strings, an array of token ids, or an "
                                    "array of arrays of token ids; got " + FieldReader::json_kind(v) + ".",
                         "invalid_type");
  };
  auto read_ids = [&](const Json& arr, const std::string& where, std::vector<int32_t>* ids) -> std::optional<ApiError> {
    // A prompt that cannot fit the context is refused before its ids are
    // converted (a 60 MiB id list must not be copied to find that out).
    if (limits.max_model_len > 0 && arr.size() >= size_t(limits.max_model_len))
      return context_length_exceeded(where, limits.max_model_len,
                                     "'" + where + "' has " + std::to_string(arr.size()) + " tokens", "prompt");
    ids->reserve(arr.size());
    for (size_t k = 0; k < arr.size(); ++k) {
      const Json& v = arr.as_array()[k];
      const std::string at = where + "[" + std::to_string(k) + "]";
      if (!v.is_int()) return invalid_param(at, "Invalid '" + at + "': a token id must be an integer, got " +
                                                    FieldReader::json_kind(v) + ".", "invalid_type");
      if (v.as_int() < 0 || v.as_int() > kMaxInt32 || (limits.vocab_size > 0 && v.as_int() >= limits.vocab_size))
        return invalid_param(at, "Invalid '" + at + "': token id " + std::to_string(v.as_int()) + " is out of range [0, " +
                                     std::to_string(limits.vocab_size) + ").");
      ids->push_back(int32_t(v.as_int()));
    }
    return std::nullopt;
  };
  if (prompt) {
    if (prompt->is_string()) {
      out->prompts.emplace_back(prompt->as_string());
    } else if (prompt->is_array()) {
      const auto& arr = prompt->as_array();
      if (arr.empty()) return invalid_param("prompt", "Invalid 'prompt': empty array.");
      if (arr[0].is_int()) {
        std::vector<int32_t> ids;
        if (auto e = read_ids(*prompt, "prompt", &ids)) return e;
        out->prompts.emplace_back(std::move(ids));
      } else {
        for (size_t i = 0; i < arr.size(); ++i) {
          const Json& p = arr[i];
          const std::string where = "prompt[" + std::to_string(i) + "]";
          if (p.is_string()) {
            out->prompts.emplace_back(p.as_string());
          } else if (p.is_array() && !p.as_array().empty()) {
            std::vector<int32_t> ids;
            if (auto e = read_ids(p, where, &ids)) return e;
            out->prompts.emplace_back(std::move(ids));
          } else if (p.is_array()) {
            return invalid_param(where, "Invalid '" + where + "': empty array.");
          } else {
            return bad_prompt(where, p);
          }
        }
      }
    } else {
      return bad_prompt("prompt", *prompt);
    }
  }
  read_stream(r, out);
  int64_t n = 1;
  if (r.integer("n", &n, 1, limits.max_n)) out->generation.n = int(n);
  const size_t completions = out->prompts.size() * size_t(out->generation.n);
  if (!r.failed() && completions > 1024)
    r.fail(invalid_param("prompt", "Invalid 'prompt': at most 1024 completions per request (prompts x n), got " +
                                       std::to_string(completions) + "."));
  int64_t best_of = 0;
  if (r.integer("best_of", &best_of, 1, limits.max_n) && best_of != out->generation.n)
    r.fail(invalid_param("best_of", "Invalid 'best_of': only best_of == n is supported.", "unsupported_value"));
  out->max_tokens = 16;  // the OpenAI default for completions
  read_max_tokens(r, "max_tokens", 0, out);
  read_sampling(r, Endpoint::Completions, out);
  read_logit_bias(r, limits, out);
  read_stop(r, limits, "stop", out);
  read_stop_token_ids(r, limits, out);
  r.boolean("include_stop_str_in_output", &out->generation.include_stop_str_in_output);
  int64_t lp = 0;
  if (r.integer("logprobs", &lp, 0, limits.max_logprobs)) out->generation.logprobs = int(lp);
  r.boolean("echo", &out->echo);
  if (out->echo) out->generation.prompt_logprobs = out->generation.logprobs;  // echo + logprobs: the prompt's too
  r.boolean("skip_special_tokens", &out->generation.skip_special_tokens);
  if (out->max_tokens && *out->max_tokens == 0 && !out->echo && !r.failed())
    r.fail(invalid_param("max_tokens", "Invalid 'max_tokens': 0 is only allowed with echo."));
  read_response_format(r, out);
  std::string user;
  r.string("user", &user);
  refuse_unsupported(r, {"suffix"});
  return r.error;
}

}  // namespace muse::server
