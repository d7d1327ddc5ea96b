// Anthropic messages request -> OpenAI chat request, so both APIs share one
// rendering path (request_render.cc).
#include "muse/chat/request_render.h"

namespace muse::chat {

namespace {

std::string at(size_t i) { return "[" + std::to_string(i) + "]"; }

Result<std::string> text_of_blocks(const Json& content, const std::string& where) {
  if (content.is_string()) return content.as_string();
  if (!content.is_array()) return make_error(where + " must be a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < content.as_array().size(); ++i) {
    const Json& b = content.as_array()[i];
    const Json* type = b.find("type");
    const Json* text = b.find("text");
    if (!type || !type->is_string() || type->as_string() != "text" || !text || !text->is_string())
      return make_error(where + at(i) + " must be a text block");
    if (!out.empty()) out += "\n";
    out += text->as_string();
  }
  return out;
}

// A user-side block as an OpenAI content part.
Result<Json> user_part(const Json& b, const std::string& where) {
  const std::string& type = b.find("type")->as_string();
  if (type == "text") {
    const Json* text = b.find("text");
    if (!text || !text->is_string()) return make_error(where + " is a text block without a string 'text'");
    return Json(JsonObject{{"type", Json("text")}, {"text", *text}});
  }
  if (type == "image") {
    const Json* source = b.find("source");
    return Json(JsonObject{{"type", Json("image_url")}, {"image_url", source ? *source : Json()}});
  }
  return make_error(where + ": content block type '" + type + "' is not supported");
}

Result<Json> tool_result_message(const Json& b, const std::string& where) {
  const Json* id = b.find("tool_use_id");
  if (!id || !id->is_string()) return make_error(where + " (tool_result) needs a string 'tool_use_id'");
  Json msg = JsonObject{{"role", Json("tool")}, {"tool_call_id", *id}};
  const Json* content = b.find("content");
  if (!content || content->is_null()) {
    msg.set("content", Json(""));
  } else if (content->is_string()) {
    msg.set("content", *content);
  } else if (content->is_array()) {
    JsonArray parts;
    for (size_t i = 0; i < content->as_array().size(); ++i) {
      const Json& part = content->as_array()[i];
      if (!part.is_object() || !part.find("type") || !part.find("type")->is_string())
        return make_error(where + ".content" + at(i) + " needs a string 'type'");
      MUSE_ASSIGN_OR_RETURN(Json converted, user_part(part, where + ".content" + at(i)));
      parts.push_back(std::move(converted));
    }
    msg.set("content", Json(std::move(parts)));
  } else {
    return make_error(where + ".content must be a string or an array of blocks");
  }
  return msg;
}

}  // namespace

Result<Json> anthropic_to_openai(const Json& request) {
  if (!request.is_object()) return make_error("the request body must be a JSON object");
  Json out = request;
  out.erase("system");
  out.erase("thinking");
  JsonArray messages;
  if (const Json* system = request.find("system"); system && !system->is_null()) {
    MUSE_ASSIGN_OR_RETURN(std::string text, text_of_blocks(*system, "system"));
    messages.push_back(Json(JsonObject{{"role", Json("system")}, {"content", Json(text)}}));
  }
  const Json* in = request.find("messages");
  if (!in || !in->is_array()) return make_error("'messages' must be an array");
  for (size_t i = 0; i < in->as_array().size(); ++i) {
    const Json& m = in->as_array()[i];
    std::string w = "messages" + at(i);
    if (!m.is_object()) return make_error(w + " must be an object");
    std::string role = m.get_string("role", "");
    if (role != "user" && role != "assistant") return make_error(w + ".role must be \"user\" or \"assistant\"");
    const Json* content = m.find("content");
    if (!content) return make_error(w + " has no 'content'");
    if (content->is_string()) {
      messages.push_back(Json(JsonObject{{"role", Json(role)}, {"content", *content}}));
      continue;
    }
    if (!content->is_array()) return make_error(w + ".content must be a string or an array of blocks");
    JsonArray parts, tool_calls;
    std::string reasoning;
    auto flush_user = [&] {
      if (parts.empty()) return;
      messages.push_back(Json(JsonObject{{"role", Json("user")}, {"content", Json(std::move(parts))}}));
      parts.clear();
    };
    for (size_t j = 0; j < content->as_array().size(); ++j) {
      const Json& b = content->as_array()[j];
      std::string bw = w + ".content" + at(j);
      if (!b.is_object() || !b.find("type") || !b.find("type")->is_string())
        return make_error(bw + " needs a string 'type'");
      const std::string& type = b.find("type")->as_string();
      if (role == "user") {
        if (type == "tool_result") {
          flush_user();
          MUSE_ASSIGN_OR_RETURN(Json msg, tool_result_message(b, bw));
          messages.push_back(std::move(msg));
        } else {
          MUSE_ASSIGN_OR_RETURN(Json part, user_part(b, bw));
          parts.push_back(std::move(part));
        }
        continue;
      }
      if (type == "text") {
        const Json* text = b.find("text");
        if (!text || !text->is_string()) return make_error(bw + " is a text block without a string 'text'");
        parts.push_back(Json(JsonObject{{"type", Json("text")}, {"text", *text}}));
      } else if (type == "thinking") {
        reasoning += b.get_string("thinking", "");
      } else if (type == "redacted_thinking") {
        // Opaque to us: nothing to render.
      } else if (type == "tool_use") {
        const Json* id = b.find("id");
        const Json* name = b.find("name");
        const Json* input = b.find("input");
        if (!id || !id->is_string() || !name || !name->is_string())
          return make_error(bw + " (tool_use) needs string 'id' and 'name'");
        if (input && !input->is_object()) return make_error(bw + ".input must be an object");
        Json fn = JsonObject{{"name", *name}, {"arguments", input ? *input : Json::object()}};
        tool_calls.push_back(Json(JsonObject{{"id", *id}, {"type", Json("function")}, {"function", std::move(fn)}}));
      } else {
        return make_error(bw + ": content block type '" + type + "' is not supported in assistant messages");
      }
    }
    if (role == "user") {
      flush_user();
      continue;
    }
    Json msg = JsonObject{{"role", Json("assistant")}};
    std::string text;
    for (const auto& p : parts) text += p.find("text")->as_string();
    msg.set("content", parts.empty() ? Json() : Json(text));
    if (!reasoning.empty()) msg.set("reasoning_content", Json(reasoning));
    if (!tool_calls.empty()) msg.set("tool_calls", Json(std::move(tool_calls)));
    messages.push_back(std::move(msg));
  }
  out.set("messages", Json(std::move(messages)));
  if (const Json* tools = request.find("tools"); tools && !tools->is_null()) {
    if (!tools->is_array()) return make_error("'tools' must be an array");
    JsonArray converted;
    for (size_t i = 0; i < tools->as_array().size(); ++i) {
      const Json& t = tools->as_array()[i];
      std::string w = "tools" + at(i);
      if (!t.is_object()) return make_error(w + " must be an object");
      if (const Json* type = t.find("type"); type && type->is_string() && type->as_string() != "custom")
        return make_error(w + ": server tool '" + type->as_string() + "' is not supported");
      Json fn = JsonObject{};
      if (const Json* name = t.find("name")) fn.set("name", *name);
      if (const Json* desc = t.find("description")) fn.set("description", *desc);
      if (const Json* schema = t.find("input_schema")) fn.set("parameters", *schema);
      converted.push_back(Json(JsonObject{{"type", Json("function")}, {"function", std::move(fn)}}));
    }
    out.set("tools", Json(std::move(converted)));
  }
  if (const Json* choice = request.find("tool_choice"); choice && !choice->is_null()) {
    std::string type = choice->is_object() ? choice->get_string("type", "") : "";
    if (type == "auto") out.set("tool_choice", Json("auto"));
    else if (type == "any") out.set("tool_choice", Json("required"));
    else if (type == "none") out.set("tool_choice", Json("none"));
    else if (type == "tool")
      out.set("tool_choice", Json(JsonObject{{"type", Json("function")},
                                             {"function", Json(JsonObject{{"name", Json(choice->get_string("name", ""))}})}}));
    else return make_error("tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\"");
  }
  // Extended thinking switched off maps to the lowest effort: Muse cannot
  // turn reasoning off (our choice).
  if (const Json* thinking = request.find("thinking"); thinking && thinking->is_object() &&
                                                      thinking->get_string("type", "") == "disabled" &&
                                                      !request.find("reasoning_effort"))
    out.set("reasoning_effort", Json("none"));
  return out;
}

}  // namespace muse::chat
