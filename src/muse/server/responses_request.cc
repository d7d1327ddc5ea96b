// OpenAI Responses request validation (/v1/responses): the body is checked
// for what only the Responses API has, converted to the equivalent chat
// completions request, and validated by the chat parser, so rendering,
// sampling, tools and structured output take one path. Stateless: nothing is
// stored, so `previous_response_id` and `conversation` are refused, and the
// response says `"store": false`.
#include "muse/server/api_request_internal.h"

namespace muse::server {

using namespace detail;

namespace {

ApiError bad(const std::string& param, const std::string& message, const std::string& code = "invalid_value") {
  return invalid_param(param, message, code);
}

// One content part of an input message -> a chat content part.
std::optional<ApiError> convert_part(const Json& part, const std::string& where, Json* out) {
  if (!part.is_object()) return bad(where, where + ": expected an object");
  const std::string type = part.get_string("type", "");
  if (type == "input_text" || type == "output_text" || type == "text") {
    const Json* text = part.find("text");
    if (!text || !text->is_string()) return bad(where + ".text", where + ".text: expected a string", "invalid_type");
    Json p = Json::object();
    p.set("type", "text");
    p.set("text", *text);
    *out = std::move(p);
    return std::nullopt;
  }
  // Refused until multimodal input exists (vLLM does the same for text-only
  // models): an answer about an image the model never saw is worse.
  if (media_kind(type)) return media_refused(where, type);
  return bad(where + ".type", where + ".type: content part type \"" + type + "\" is not supported", "unsupported_value");
}

// Text of a function_call_output's `output` (a string, or input_text parts).
std::optional<ApiError> output_text(const Json& output, const std::string& where, std::string* text) {
  if (output.is_string()) {
    *text = output.as_string();
    return std::nullopt;
  }
  if (!output.is_array()) return bad(where, where + ": expected a string or an array of input_text parts", "invalid_type");
  for (const Json& p : output.as_array()) {
    if (!p.is_object() || p.get_string("type", "") != "input_text" || !p.find("text") || !p.find("text")->is_string())
      return bad(where, where + ": only input_text parts are supported in a tool output", "unsupported_value");
    *text += p.find("text")->as_string();
  }
  return std::nullopt;
}

// input (a string, or items) -> chat messages.
std::optional<ApiError> convert_input(const Json& input, Json* messages) {
  if (input.is_string()) {
    Json m = Json::object();
    m.set("role", "user");
    m.set("content", input);
    messages->push_back(std::move(m));
    return std::nullopt;
  }
  if (!input.is_array()) return invalid_type("input", "a string or an array of input items", FieldReader::json_kind(input));
  if (input.as_array().empty()) return bad("input", "input: at least one item is required");
  std::string pending_reasoning;  // a reasoning item: goes with the next assistant turn
  Json* open_calls = nullptr;     // the assistant message collecting consecutive function_calls
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& item = input.as_array()[i];
    const std::string where = "input." + std::to_string(i);
    if (!item.is_object()) return invalid_type(where, "an object", FieldReader::json_kind(item));
    std::string type = item.get_string("type", item.find("role") ? "message" : "");
    if (type == "message") {
      const std::string role = item.get_string("role", "");
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return bad(where + ".role", where + ".role: expected user, assistant, system or developer");
      const Json* content = item.find("content");
      if (!content || !(content->is_string() || content->is_array()))
        return bad(where + ".content", where + ".content: expected a string or an array of content parts", "invalid_type");
      Json m = Json::object();
      m.set("role", role);
      if (content->is_string()) {
        m.set("content", *content);
      } else {
        Json parts = Json::array();
        for (size_t k = 0; k < content->size(); ++k) {
          Json p;
          if (auto e = convert_part(content->as_array()[k], where + ".content." + std::to_string(k), &p)) return e;
          parts.push_back(std::move(p));
        }
        m.set("content", std::move(parts));
      }
      if (role == "assistant" && !pending_reasoning.empty()) {
        m.set("reasoning_content", pending_reasoning);
        pending_reasoning.clear();
      }
      messages->push_back(std::move(m));
      open_calls = nullptr;
    } else if (type == "function_call") {
      const Json* name = item.find("name");
      const Json* args = item.find("arguments");
      const Json* call_id = item.find("call_id");
      if (!name || !name->is_string()) return bad(where + ".name", where + ".name: expected a string", "invalid_type");
      if (!args || !args->is_string()) return bad(where + ".arguments", where + ".arguments: expected a JSON string", "invalid_type");
      if (!call_id || !call_id->is_string()) return bad(where + ".call_id", where + ".call_id: expected a string", "invalid_type");
      if (!open_calls) {  // consecutive calls form one assistant turn (parallel calls)
        Json m = Json::object();
        m.set("role", "assistant");
        m.set("content", Json());
        if (!pending_reasoning.empty()) m.set("reasoning_content", pending_reasoning);
        pending_reasoning.clear();
        m.set("tool_calls", Json::array());
        messages->push_back(std::move(m));
        open_calls = &messages->as_array().back();
      }
      Json fn = Json::object();
      fn.set("name", *name);
      fn.set("arguments", *args);
      Json call = Json::object();
      call.set("id", *call_id);
      call.set("type", "function");
      call.set("function", std::move(fn));
      Json calls = *open_calls->find("tool_calls");
      calls.push_back(std::move(call));
      open_calls->set("tool_calls", std::move(calls));
    } else if (type == "function_call_output") {
      const Json* call_id = item.find("call_id");
      const Json* output = item.find("output");
      if (!call_id || !call_id->is_string()) return bad(where + ".call_id", where + ".call_id: expected a string", "invalid_type");
      if (!output) return bad(where + ".output", where + ".output: Field required", "missing_required_parameter");
      std::string text;
      if (auto e = output_text(*output, where + ".output", &text)) return e;
      Json m = Json::object();
      m.set("role", "tool");
      m.set("tool_call_id", *call_id);
      m.set("content", text);
      messages->push_back(std::move(m));
      open_calls = nullptr;
    } else if (type == "reasoning") {
      // Reasoning text comes back in `content` (reasoning_text parts) or, from
      // clients that only keep summaries, in `summary` (summary_text parts).
      for (const char* key : {"content", "summary"}) {
        const Json* parts = item.find(key);
        if (!parts || !parts->is_array()) continue;
        for (const Json& p : parts->as_array())
          if (p.is_object() && p.find("text") && p.find("text")->is_string()) pending_reasoning += p.find("text")->as_string();
        if (!pending_reasoning.empty()) break;
      }
      open_calls = nullptr;
    } else {
      return bad(where + ".type", where + ".type: input item type \"" + type +
                                      "\" is not supported (message, function_call, function_call_output, reasoning)",
                 "unsupported_value");
    }
  }
  return std::nullopt;
}

// tools: [{type: function, name, description, parameters, strict}] -> chat tools.
std::optional<ApiError> convert_tools(const Json& tools, Json* out) {
  if (!tools.is_array()) return invalid_type("tools", "an array", FieldReader::json_kind(tools));
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools.as_array()[i];
    const std::string where = "tools." + std::to_string(i);
    if (!t.is_object()) return invalid_type(where, "an object", FieldReader::json_kind(t));
    const std::string type = t.get_string("type", "");
    if (type != "function")
      return bad(where + ".type", where + ".type: only function tools are supported, got \"" + type + "\"", "unsupported_value");
    Json fn = Json::object();
    for (const char* k : {"name", "description", "parameters"})
      if (const Json* v = t.find(k)) fn.set(k, *v);
    Json ct = Json::object();
    ct.set("type", "function");
    ct.set("function", std::move(fn));
    out->push_back(std::move(ct));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_responses_request(const Json& body, const ValidationLimits& limits, ApiRequest* out) {
  for (const char* k : {"previous_response_id", "conversation", "prompt"})
    if (const Json* v = body.find(k); v && !v->is_null())
      return bad(k, std::string(k) + ": not supported (this server is stateless and stores no responses or prompts)",
                 "unsupported_parameter");
  if (const Json* v = body.find("background"); v && v->is_bool() && v->as_bool())
    return bad("background", "background: background responses are not supported", "unsupported_parameter");
  if (const Json* v = body.find("truncation"); v && !(v->is_null() || (v->is_string() && v->as_string() == "disabled")))
    return bad("truncation", "truncation: only \"disabled\" is supported (a prompt that does not fit is an error)", "unsupported_value");
  if (const Json* v = body.find("include"); v && !v->is_null()) {
    if (!v->is_array()) return invalid_type("include", "an array", FieldReader::json_kind(*v));
    for (const Json& x : v->as_array())  // (no encrypted reasoning: nothing is stored)
      if (!x.is_string() || x.as_string() != "reasoning.encrypted_content")
        return bad("include", "include: " + x.dump() + " is not supported", "unsupported_value");
  }
  const Json* input = body.find("input");
  if (!input) return bad("input", "input: Field required", "missing_required_parameter");

  Json chat = Json::object();
  Json messages = Json::array();
  if (const Json* ins = body.find("instructions"); ins && !ins->is_null()) {
    if (!ins->is_string()) return invalid_type("instructions", "a string", FieldReader::json_kind(*ins));
    Json m = Json::object();
    m.set("role", "system");
    m.set("content", *ins);
    messages.push_back(std::move(m));
  }
  if (auto e = convert_input(*input, &messages)) return e;
  chat.set("messages", std::move(messages));
  for (const char* k : {"model", "stream", "temperature", "top_p", "top_k", "min_p", "parallel_tool_calls", "seed",
                        "stop", "repetition_penalty", "presence_penalty", "frequency_penalty", "user", "metadata"})
    if (const Json* v = body.find(k)) chat.set(k, *v);
  if (const Json* v = body.find("max_output_tokens"); v && !v->is_null()) chat.set("max_completion_tokens", *v);
  if (const Json* tools = body.find("tools"); tools && !tools->is_null()) {
    Json ct = Json::array();
    if (auto e = convert_tools(*tools, &ct)) return e;
    if (!ct.as_array().empty()) chat.set("tools", std::move(ct));
  }
  if (const Json* tc = body.find("tool_choice"); tc && !tc->is_null()) {
    if (tc->is_object() && tc->get_string("type", "") == "function" && tc->find("name")) {
      Json fn = Json::object();
      fn.set("name", *tc->find("name"));
      Json c = Json::object();
      c.set("type", "function");
      c.set("function", std::move(fn));
      chat.set("tool_choice", std::move(c));
    } else {
      chat.set("tool_choice", *tc);
    }
  }
  if (const Json* r = body.find("reasoning"); r && !r->is_null()) {
    if (!r->is_object()) return invalid_type("reasoning", "an object", FieldReader::json_kind(*r));
    if (const Json* e = r->find("effort"); e && !e->is_null()) chat.set("reasoning_effort", *e);
  }
  if (const Json* t = body.find("text"); t && !t->is_null()) {
    if (!t->is_object()) return invalid_type("text", "an object", FieldReader::json_kind(*t));
    if (const Json* f = t->find("format"); f && f->is_object()) {
      const std::string type = f->get_string("type", "text");
      Json rf = Json::object();
      rf.set("type", type);
      if (type == "json_schema") {
        Json js = Json::object();
        js.set("name", f->get_string("name", "response"));
        if (const Json* schema = f->find("schema")) js.set("schema", *schema);
        rf.set("json_schema", std::move(js));
      }
      chat.set("response_format", std::move(rf));
    }
  }
  if (chat.get_bool("stream", false)) {  // response.completed always carries usage
    Json so = Json::object();
    so.set("include_usage", true);
    chat.set("stream_options", std::move(so));
  }
  if (auto e = parse_chat_request(chat, limits, out)) {
    // Name the Responses parameter where it differs from the chat one.
    if (e->param == "max_completion_tokens") {
      e->param = "max_output_tokens";
      if (size_t at = e->message.find("'max_completion_tokens'"); at != std::string::npos)
        e->message.replace(at, 23, "'max_output_tokens'");
    }
    if (e->param.rfind("messages", 0) == 0) e->param = "input";
    return e;
  }
  out->endpoint = Endpoint::Responses;
  return std::nullopt;
}

}  // namespace muse::server
