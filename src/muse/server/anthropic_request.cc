// Anthropic Messages request validation (/v1/messages).
#include <algorithm>

#include "muse/server/api_request_internal.h"

namespace muse::server {

using namespace detail;

namespace {

// Image (and document) blocks, also inside a tool_result: refused until
// multimodal input exists.
std::optional<ApiError> refuse_media(const Json& block, const std::string& where) {
  const std::string type = block.get_string("type", "");
  if (media_kind(type)) return media_refused(where, type);
  if (type != "tool_result") return std::nullopt;
  const Json* inner = block.find("content");
  if (!inner || !inner->is_array()) return std::nullopt;
  for (size_t k = 0; k < inner->size(); ++k) {
    const Json& b = inner->as_array()[k];
    if (b.is_object() && media_kind(b.get_string("type", "")))
      return media_refused(where + ".content." + std::to_string(k), b.get_string("type", ""));
  }
  return std::nullopt;
}

std::vector<std::string> block_ids(const Json& message, const char* type, const char* id_key) {
  std::vector<std::string> ids;
  const Json* content = message.find("content");
  if (!content || !content->is_array()) return ids;
  for (const Json& b : content->as_array())
    if (b.get_string("type", "") == type) ids.push_back(b.get_string(id_key, ""));
  return ids;
}

// Anthropic's rule: every tool_use of an assistant turn is answered by a
// tool_result in the very next (user) message, and every tool_result answers
// a tool_use of the message right before it.
std::optional<ApiError> check_tool_pairing(const Json& messages) {
  const auto& list = messages.as_array();
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string role = list[i].get_string("role", "");
    if (role == "assistant") {
      std::vector<std::string> uses = block_ids(list[i], "tool_use", "id");
      if (uses.empty()) continue;
      std::vector<std::string> results = i + 1 < list.size() ? block_ids(list[i + 1], "tool_result", "tool_use_id")
                                                             : std::vector<std::string>{};
      std::string missing;
      for (const auto& id : uses)
        if (std::find(results.begin(), results.end(), id) == results.end()) missing += (missing.empty() ? "" : ", ") + id;
      if (!missing.empty()) {
        std::string where = "messages." + std::to_string(i + 1 < list.size() ? i + 1 : i);
        return invalid_param(where, where + ": `tool_use` ids were found without `tool_result` blocks immediately after: " +
                                        missing + ". Each `tool_use` block must have a corresponding `tool_result` block in the next message.");
      }
    } else {
      std::vector<std::string> results = block_ids(list[i], "tool_result", "tool_use_id");
      if (results.empty()) continue;
      std::vector<std::string> uses = i > 0 ? block_ids(list[i - 1], "tool_use", "id") : std::vector<std::string>{};
      for (const auto& id : results)
        if (std::find(uses.begin(), uses.end(), id) == uses.end()) {
          std::string where = "messages." + std::to_string(i);
          return invalid_param(where, where + ": unexpected `tool_use_id` found in `tool_result` blocks: " + id +
                                          ". Each `tool_result` block must have a corresponding `tool_use` block in the previous message.");
        }
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_messages_request(const Json& body, const ValidationLimits& limits, ApiRequest* out) {
  start_request(Endpoint::Messages, body, out);
  FieldReader r(body);
  r.string("model", &out->model);
  if (!r.get("max_tokens")) return invalid_param("max_tokens", "max_tokens: Field required", "missing_required_parameter");
  read_max_tokens(r, "max_tokens", 1, out);
  const int64_t max_tokens = out->max_tokens.value_or(0);
  const Json* messages = r.get("messages");
  if (!messages && !r.failed()) return invalid_param("messages", "messages: Field required", "missing_required_parameter");
  if (messages && !messages->is_array()) return invalid_type("messages", "an array", FieldReader::json_kind(*messages));
  if (messages && messages->as_array().empty()) return invalid_param("messages", "messages: at least one message is required");
  if (messages) {
    for (size_t i = 0; i < messages->size(); ++i) {
      const Json& m = messages->as_array()[i];
      std::string where = "messages." + std::to_string(i);
      if (!m.is_object()) return invalid_type(where, "an object", FieldReader::json_kind(m));
      std::string role = m.get_string("role", "");
      if (role != "user" && role != "assistant")
        return invalid_param(where + ".role", where + ".role: Input should be 'user' or 'assistant'");
      const Json* content = m.find("content");
      if (!content || !(content->is_string() || content->is_array()))
        return invalid_param(where + ".content", where + ".content: expected a string or an array of content blocks", "invalid_type");
      if (content->is_array())
        for (size_t j = 0; j < content->size(); ++j) {
          const Json& block = content->as_array()[j];
          if (!block.is_object() || !block.find("type") || !block.find("type")->is_string())
            return invalid_param(where + ".content", where + ".content: each block must be an object with a string 'type'");
          const std::string bw = where + ".content." + std::to_string(j);
          if (auto e = refuse_media(block, bw)) return e;
        }
    }
    if (auto e = check_tool_pairing(*messages)) return e;
  }
  if (const Json* sys = r.get("system"); sys && !r.failed()) {
    bool ok = sys->is_string();
    if (sys->is_array())
      ok = std::all_of(sys->as_array().begin(), sys->as_array().end(),
                       [](const Json& b) { return b.is_object() && b.get_string("type", "") == "text" && b.find("text") && b.find("text")->is_string(); });
    if (!ok) r.fail(invalid_param("system", "system: expected a string or an array of text blocks", "invalid_type"));
  }
  r.boolean("stream", &out->stream);
  read_sampling(r, Endpoint::Messages, out);
  read_stop(r, limits, "stop_sequences", out);
  if (const Json* tools = r.typed("tools", Json::Type::Array, "an array")) {
    for (size_t i = 0; i < tools->size() && !r.failed(); ++i) {
      const Json& t = tools->as_array()[i];
      std::string where = "tools." + std::to_string(i);
      if (!t.is_object()) { r.fail(invalid_type(where, "an object", FieldReader::json_kind(t))); break; }
      std::string type = t.get_string("type", "custom");
      if (type != "custom") {
        r.fail(invalid_param(where + ".type", where + ".type: only custom (client) tools are supported, got \"" + type + "\"", "unsupported_value"));
        break;
      }
      const Json* name = t.find("name");
      if (!name || !name->is_string() || !valid_tool_name(name->as_string())) {
        r.fail(invalid_param(where + ".name", where + ".name: a tool name must match [A-Za-z0-9_.-]{1,128}"));
        break;
      }
      const Json* schema = t.find("input_schema");
      if (!schema || !schema->is_object()) {
        r.fail(invalid_param(where + ".input_schema", where + ".input_schema: Field required (an object)", "missing_required_parameter"));
        break;
      }
    }
    if (!tools->as_array().empty()) out->tools = *tools;
  }
  out->tool_choice.kind = out->tools.is_null() ? ToolChoice::Kind::None : ToolChoice::Kind::Auto;
  if (const Json* tc = r.typed("tool_choice", Json::Type::Object, "an object")) {
    std::string type = tc->get_string("type", "");
    if (type == "auto") out->tool_choice.kind = ToolChoice::Kind::Auto;
    else if (type == "any") out->tool_choice.kind = ToolChoice::Kind::Required;
    else if (type == "none") out->tool_choice.kind = ToolChoice::Kind::None;
    else if (type == "tool" && tc->find("name") && tc->find("name")->is_string()) {
      out->tool_choice.kind = ToolChoice::Kind::Named;
      out->tool_choice.name = tc->find("name")->as_string();
    } else {
      r.fail(invalid_param("tool_choice", "tool_choice: expected {\"type\": \"auto\"|\"any\"|\"none\"} or {\"type\": \"tool\", \"name\": ...}"));
    }
    FieldReader t(*tc);
    bool disable_parallel = false;
    if (t.boolean("disable_parallel_tool_use", &disable_parallel)) out->parallel_tool_calls = !disable_parallel;
    if (t.error) r.fail(invalid_param("tool_choice.disable_parallel_tool_use", t.error->message, "invalid_type"));
    if (!r.failed()) check_tool_choice(r, out);
  }
  if (const Json* thinking = r.typed("thinking", Json::Type::Object, "an object")) {
    std::string type = thinking->get_string("type", "");
    if (type != "enabled" && type != "disabled" && type != "adaptive")
      r.fail(invalid_param("thinking.type", "thinking.type: expected \"enabled\", \"disabled\" or \"adaptive\""));
    if (const Json* b = thinking->find("budget_tokens"); b && !r.failed() && !(b->is_int() && b->as_int() >= 1))
      r.fail(invalid_param("thinking.budget_tokens", "thinking.budget_tokens: expected a positive integer"));
    else if (b && !r.failed() && type == "enabled" && b->as_int() >= max_tokens)  // Anthropic's rule
      r.fail(invalid_param("thinking.budget_tokens", "`max_tokens` must be greater than `thinking.budget_tokens` (" +
                                                         std::to_string(b->as_int()) + " >= " + std::to_string(max_tokens) + ")"));
  }
  if (const Json* oc = r.typed("output_config", Json::Type::Object, "an object")) {
    if (const Json* effort = oc->find("effort"); effort && !effort->is_null()) {
      static const char* kEfforts[] = {"low", "medium", "high", "xhigh", "max"};
      if (!effort->is_string() ||
          std::none_of(std::begin(kEfforts), std::end(kEfforts), [&](const char* e) { return effort->as_string() == e; }))
        r.fail(invalid_param("output_config.effort", "output_config.effort: expected one of low, medium, high, xhigh, max"));
    }
  }
  r.typed("metadata", Json::Type::Object, "an object");
  bool add_generation_prompt = true, continue_final = false;
  r.boolean("add_generation_prompt", &add_generation_prompt);
  r.boolean("continue_final_message", &continue_final);
  read_template_kwargs(r, &add_generation_prompt, &continue_final);
  for (const char* k : {"mcp_servers", "container"})
    if (r.get(k) && !r.failed()) r.fail(invalid_param(k, std::string(k) + ": not supported by this server", "unsupported_parameter"));
  return r.error;
}

}  // namespace muse::server
