#include "muse/chat/request_render.h"

#include <algorithm>

#include "muse/chat/tool_schema.h"

namespace muse::chat {

namespace {

std::string at(size_t i) { return "[" + std::to_string(i) + "]"; }

bool has(const std::vector<std::string>& v, std::string_view s) { return std::find(v.begin(), v.end(), s) != v.end(); }

// Muse Spark's `esc` (chat-format.md §7): caller text cannot forge markers
// or media placeholders.
std::string spark_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "<|") == 0) {
      out += "< |";
      ++i;
      continue;
    }
    bool media = false;
    for (const char* tag : {"<image>", "<video>", "<audio>"}) {
      size_t n = std::char_traits<char>::length(tag);
      if (s.compare(i, n, tag) == 0) {
        out += "< ";
        out.append(tag + 1, n - 1);
        i += n - 1;
        media = true;
        break;
      }
    }
    if (!media) out.push_back(s[i]);
  }
  return out;
}

std::string header_value(const std::string& s, const ChatProfile& p) {
  if (p.escaping != CallerTextEscaping::SparkEsc) return s;
  std::string out;
  for (char c : s)
    if (c != '\r' && c != '\n') out.push_back(c);
  return spark_escape(out);
}

std::string caller_text(const std::string& s, const ChatProfile& p) {
  return p.escaping == CallerTextEscaping::SparkEsc ? spark_escape(s) : s;
}

Result<Json> convert_content(const Json& content, const std::string& where, const ChatTemplate& tpl) {
  const ChatProfile& p = tpl.profile();
  if (content.is_null()) return Json();
  if (content.is_string()) return Json(caller_text(content.as_string(), p));
  if (!content.is_array()) return make_error(where + " must be a string, an array of content parts, or null");
  JsonArray parts;
  bool all_text = true;
  for (size_t j = 0; j < content.as_array().size(); ++j) {
    const Json& part = content.as_array()[j];
    std::string pw = where + at(j);
    if (!part.is_object()) return make_error(pw + " must be an object");
    const Json* type = part.find("type");
    if (!type || !type->is_string()) return make_error(pw + " needs a string 'type'");
    const std::string& t = type->as_string();
    auto mapped = std::find_if(p.part_map.begin(), p.part_map.end(), [&](const auto& kv) { return kv.first == t; });
    if (mapped == p.part_map.end()) {
      if (p.is_muse) return make_error(pw + ": content part type '" + t + "' is not supported by this model");
      parts.push_back(part);  // generic templates see unknown parts as sent
      all_text = false;
      continue;
    }
    if (mapped->second.empty()) continue;
    if (mapped->second == "text") {
      const Json* text = part.find("text");
      if (!text || !text->is_string()) return make_error(pw + " is a text part without a string 'text'");
      parts.push_back(Json(JsonObject{{"type", Json("text")}, {"text", Json(caller_text(text->as_string(), p))}}));
    } else {
      parts.push_back(Json(JsonObject{{"type", Json(mapped->second)}}));
      all_text = false;
    }
  }
  if (all_text && !tpl.accepts_content_lists()) {
    // vLLM's "string" content format: text parts joined by newlines.
    std::string joined;
    for (size_t k = 0; k < parts.size(); ++k) {
      if (k) joined += "\n";
      joined += parts[k].find("text")->as_string();
    }
    return Json(std::move(joined));
  }
  return Json(std::move(parts));
}

Result<Json> convert_tool_calls(const Json& calls, const std::string& where, const ChatProfile& p) {
  if (calls.is_null()) return Json();
  if (!calls.is_array()) return make_error(where + " must be an array");
  JsonArray out;
  for (size_t k = 0; k < calls.as_array().size(); ++k) {
    const Json& c = calls.as_array()[k];
    std::string cw = where + at(k);
    if (!c.is_object()) return make_error(cw + " must be an object");
    const Json* fn = c.find("function");
    if (!fn || !fn->is_object()) return make_error(cw + " needs a 'function' object");
    const Json* name = fn->find("name");
    if (!name || !name->is_string() || name->as_string().empty())
      return make_error(cw + ".function.name must be a non-empty string");
    Json args = JsonObject{};
    if (const Json* a = fn->find("arguments"); a && !a->is_null()) {
      if (a->is_string()) {
        std::string_view text = a->as_string();
        if (text.find_first_not_of(" \t\r\n") != std::string_view::npos) {
          auto parsed = Json::parse(text);
          if (!parsed.ok())
            return make_error(cw + ".function.arguments is not valid JSON: " + parsed.message());
          args = std::move(parsed).value();
        }
      } else {
        args = *a;
      }
      if (!args.is_object()) return make_error(cw + ".function.arguments must be a JSON object");
    }
    Json call = c;
    Json f = *fn;
    f.set("name", Json(header_value(name->as_string(), p)));
    f.set("arguments", std::move(args));
    call.set("function", std::move(f));
    if (const Json* id = c.find("id"); id && !id->is_string() && !id->is_null())
      return make_error(cw + ".id must be a string");
    out.push_back(std::move(call));
  }
  return Json(std::move(out));
}

Result<Json> convert_messages(const Json& messages, const ChatTemplate& tpl) {
  const ChatProfile& p = tpl.profile();
  if (!messages.is_array()) return make_error("'messages' must be an array");
  if (messages.as_array().empty()) return make_error("'messages' must not be empty");
  JsonArray out;
  for (size_t i = 0; i < messages.as_array().size(); ++i) {
    const Json& m = messages.as_array()[i];
    std::string w = "messages" + at(i);
    if (!m.is_object()) return make_error(w + " must be an object");
    const Json* role = m.find("role");
    if (!role) return make_error(w + " has no 'role'");
    if (!role->is_string() || role->as_string().empty()) return make_error(w + ".role must be a non-empty string");
    std::string r = role->as_string();
    for (const auto& [from, to] : p.role_map)
      if (r == from) r = to;
    Json msg = m;
    msg.set("role", Json(r));
    if (const Json* content = m.find("content")) {
      MUSE_ASSIGN_OR_RETURN(Json c, convert_content(*content, w + ".content", tpl));
      msg.set("content", std::move(c));
    } else if (r == "user" || r == "system") {
      return make_error(w + " (" + r + ") has no 'content'");
    }
    // Clients send the previous turn's reasoning back as `reasoning` (vLLM's
    // name) or `reasoning_content`.
    const Json* reasoning = m.find("reasoning_content");
    if (!reasoning || reasoning->is_null()) reasoning = m.find("reasoning");
    if (reasoning && !reasoning->is_null()) {
      if (!reasoning->is_string()) return make_error(w + ".reasoning_content must be a string");
      msg.erase("reasoning");
      msg.set("reasoning_content", Json(caller_text(reasoning->as_string(), p)));
    }
    if (const Json* calls = m.find("tool_calls")) {
      if (r != "assistant" && !calls->is_null()) return make_error(w + ": only assistant messages carry tool_calls");
      MUSE_ASSIGN_OR_RETURN(Json c, convert_tool_calls(*calls, w + ".tool_calls", p));
      msg.set("tool_calls", std::move(c));
    }
    if (r == "tool") {
      const Json* id = m.find("tool_call_id");
      const Json* name = m.find("name");
      bool has_id = id && id->is_string();
      bool has_name = name && name->is_string() && !name->as_string().empty();
      if (id && !id->is_null() && !id->is_string()) return make_error(w + ".tool_call_id must be a string");
      if (!has_id && !has_name) return make_error(w + ": a tool message needs 'tool_call_id'");
    }
    for (const char* key : {"name", "recipient"})
      if (const Json* v = m.find(key); v && v->is_string()) msg.set(key, Json(header_value(v->as_string(), p)));
    out.push_back(std::move(msg));
  }
  return Json(std::move(out));
}

Status validate_tools(const Json& tools, const ChatProfile& p) {
  if (tools.is_null()) return Status::Ok();
  if (!tools.is_array()) return make_error("'tools' must be an array");
  for (size_t i = 0; i < tools.as_array().size(); ++i) {
    const Json& t = tools.as_array()[i];
    std::string w = "tools" + at(i);
    if (!t.is_object()) return make_error(w + " must be an object");
    const Json* type = t.find("type");
    if (type && (!type->is_string() || type->as_string() != "function"))
      return make_error(w + ".type must be \"function\"");
    const Json* fn = t.find("function");
    if (type && (!fn || !fn->is_object())) return make_error(w + " needs a 'function' object");
    if (!fn) fn = &t;
    const Json* name = fn->find("name");
    if (!name || !name->is_string()) return make_error(w + ".function.name must be a string");
    if (!p.is_muse) continue;
    if (!is_valid_tool_name(name->as_string()))
      return make_error(w + ".function.name '" + name->as_string() + "' must match [A-Za-z0-9_.-]+");
    // The Muse template writes both with tojson (transformers raises without
    // them), but both APIs make them optional: fill_tool_defaults() supplies
    // them; what is given must have the right type.
    const Json* desc = fn->find("description");
    if (desc && !desc->is_null() && !desc->is_string()) return make_error(w + ".function.description must be a string");
    const Json* params = fn->find("parameters");
    if (params && !params->is_null() && !params->is_object()) return make_error(w + ".function.parameters must be an object");
  }
  return Status::Ok();
}

// OpenAI and Anthropic both let a tool leave out its description (and
// OpenAI its parameters); the Muse template needs both, so an absent one is
// rendered as an empty description / a schema without properties.
Json fill_tool_defaults(const Json& tools, const ChatProfile& p) {
  if (!p.is_muse || !tools.is_array()) return tools;
  Json out = tools;
  for (Json& t : out.as_array()) {
    Json* fn = t.find("function");
    if (!fn) fn = &t;
    if (!fn->is_object()) continue;
    const Json* desc = fn->find("description");
    if (!desc || desc->is_null()) fn->set("description", Json(""));
    const Json* params = fn->find("parameters");
    if (!params || params->is_null())
      fn->set("parameters", Json(JsonObject{{"type", Json("object")}, {"properties", Json::object()}}));
  }
  return out;
}

Status validate_tool_choice(const Json& request, const Json& tools) {
  const Json* choice = request.find("tool_choice");
  if (!choice || choice->is_null()) return Status::Ok();
  if (choice->is_string()) {
    const std::string& c = choice->as_string();
    if (c != "none" && c != "auto" && c != "required")
      return make_error("tool_choice must be \"none\", \"auto\", \"required\" or a named function");
    if (c == "required" && (!tools.is_array() || tools.as_array().empty()))
      return make_error("tool_choice \"required\" needs at least one tool");
    return Status::Ok();
  }
  const Json* fn = choice->is_object() ? choice->find("function") : nullptr;
  const Json* name = fn && fn->is_object() ? fn->find("name") : nullptr;
  if (!name || !name->is_string()) return make_error("tool_choice must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}");
  auto set = ToolSet::from_json(tools);
  if (!set.ok() || !set->find(name->as_string()))
    return make_error("tool_choice names '" + name->as_string() + "', which is not in 'tools'");
  return Status::Ok();
}

// reasoning_effort -> the profile's kwarg (chat-format.md requirement 6).
Status map_effort(const Json& request, const ChatProfile& p, JsonObject& kwargs) {
  if (p.effort_kwarg.empty()) return Status::Ok();
  const Json* effort = request.find("reasoning_effort");
  if ((!effort || effort->is_null()) && request.find("reasoning")) {
    const Json* r = request.find("reasoning");
    if (r->is_object()) effort = r->find("effort");
  }
  if (!effort || effort->is_null()) return Status::Ok();
  if (!effort->is_string()) return make_error("reasoning_effort must be a string");
  for (const auto& [k, v] : kwargs)
    if (k == p.effort_kwarg) return Status::Ok();  // chat_template_kwargs wins
  for (const auto& [name, value] : p.effort_map)
    if (name == effort->as_string()) {
      kwargs.emplace_back(p.effort_kwarg, value);
      return Status::Ok();
    }
  std::string allowed;
  for (const auto& [name, value] : p.effort_map) allowed += (allowed.empty() ? "" : ", ") + name;
  return make_error("reasoning_effort '" + effort->as_string() + "' is not supported (use one of: " + allowed + ")");
}

// transformers' continue_final_message: cut the prompt right after the last
// message's text, so generation continues it.
Result<std::string> cut_after_final_message(const std::string& rendered, const Json& messages) {
  const Json& last = messages.as_array().back();
  const Json* content = last.find("content");
  std::string final_text;
  bool found = false;
  if (content && content->is_string()) {
    final_text = content->as_string();
    found = true;
  } else if (content && content->is_array()) {
    for (auto it = content->as_array().rbegin(); it != content->as_array().rend(); ++it) {
      const Json* text = it->find("text");
      if (text && text->is_string()) {
        final_text = text->as_string();
        found = true;
        break;
      }
    }
  }
  if (!found) return make_error("continue_final_message is set but the final message has no text to continue");
  auto is_ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  size_t b = 0, e = final_text.size();
  while (b < e && is_ws(final_text[b])) ++b;
  while (e > b && is_ws(final_text[e - 1])) --e;
  std::string stripped = final_text.substr(b, e - b);
  size_t loc = rendered.rfind(stripped);
  if (stripped.empty() || loc == std::string::npos)
    return make_error("continue_final_message is set but the final message does not appear in the rendered prompt");
  std::string lstripped = final_text.substr(b);
  if (rendered.compare(loc, lstripped.size(), lstripped) == 0 && loc + lstripped.size() <= rendered.size() &&
      rendered.substr(loc, lstripped.size()) == final_text)
    return rendered.substr(0, loc + lstripped.size());
  return rendered.substr(0, loc + stripped.size());
}

}  // namespace

Result<Json> build_template_context(const Json& request_in, const ChatTemplate& tpl, const ChatRenderOptions& options) {
  Json converted;
  const Json* request = &request_in;
  if (options.api == RequestApi::AnthropicMessages) {
    MUSE_ASSIGN_OR_RETURN(converted, anthropic_to_openai(request_in));
    request = &converted;
  }
  if (!request->is_object()) return make_error("the request body must be a JSON object");
  const ChatProfile& p = tpl.profile();
  const Json* messages = request->find("messages");
  if (!messages) return make_error("the request has no 'messages'");
  MUSE_ASSIGN_OR_RETURN(Json msgs, convert_messages(*messages, tpl));
  Json tools = request->find("tools") ? *request->find("tools") : Json();
  MUSE_RETURN_IF_ERROR(validate_tools(tools, p));
  MUSE_RETURN_IF_ERROR(validate_tool_choice(*request, tools));
  tools = fill_tool_defaults(tools, p);
  MUSE_ASSIGN_OR_RETURN(bool add_generation_prompt, request->bool_member("add_generation_prompt", true));
  MUSE_ASSIGN_OR_RETURN(bool continue_final, request->bool_member("continue_final_message", false));
  bool add_given = request->find("add_generation_prompt") != nullptr;

  JsonObject kwargs;
  if (const Json* k = request->find("chat_template_kwargs"); k && !k->is_null()) {
    if (!k->is_object()) return make_error("chat_template_kwargs must be an object");
    for (const auto& [name, value] : k->as_object()) {
      // The context variables the request itself supplies cannot be swapped
      // for arbitrary values: the rest of the pipeline (tool parsing, the
      // generation prompt, continue_final_message) relies on their types.
      if (name == "messages" || name == "tools" || name == "documents")
        return make_error("chat_template_kwargs cannot replace '" + name + "' (send it as the request's own field)");
      if (name == "add_generation_prompt" || name == "continue_final_message") {
        if (!value.is_bool()) return make_error("chat_template_kwargs." + name + " must be a boolean, got " + value.type_name());
        // As in vLLM, chat_template_kwargs win over the top-level flags.
        if (name == "add_generation_prompt") add_generation_prompt = value.as_bool(), add_given = true;
        else continue_final = value.as_bool();
        continue;
      }
      kwargs.emplace_back(name, value);
    }
  }
  if (add_generation_prompt && continue_final && add_given)
    return make_error("continue_final_message and add_generation_prompt cannot both be true");
  if (continue_final) add_generation_prompt = false;
  MUSE_RETURN_IF_ERROR(map_effort(*request, p, kwargs));

  Json ctx = Json::object();
  ctx.set("messages", std::move(msgs));
  ctx.set("tools", tools);
  ctx.set("documents", request->find("documents") ? *request->find("documents") : Json());
  ctx.set("add_generation_prompt", add_generation_prompt);
  for (const auto& [k, v] : tpl.special_tokens()) ctx.set(k, Json(v));
  for (auto& [k, v] : kwargs) ctx.set(k, std::move(v));
  return ctx;
}

Result<ChatPrompt> render_chat(const Json& request, const ChatTemplate& tpl, const ChatRenderOptions& options) {
  MUSE_ASSIGN_OR_RETURN(Json ctx, build_template_context(request, tpl, options));
  ChatPrompt out;
  out.add_generation_prompt = ctx.get_bool("add_generation_prompt", true);
  // build_template_context validated both places the flag can come from.
  const Json* kw = request.find("chat_template_kwargs");
  out.continue_final_message = options.api != RequestApi::AnthropicMessages &&
                               (kw && kw->find("continue_final_message") ? kw->get_bool("continue_final_message", false)
                                                                         : request.get_bool("continue_final_message", false));
  const Json* tools = ctx.find("tools");
  bool has_tools = tools && !tools->is_null();  // transformers: `tools is not None`
  MUSE_ASSIGN_OR_RETURN(out.text, tpl.compiled_for(has_tools).render(ctx, options.render));
  if (out.continue_final_message) {
    MUSE_ASSIGN_OR_RETURN(out.text, cut_after_final_message(out.text, *ctx.find("messages")));
  }
  return out;
}

Result<std::string> render_chat_prompt(const Json& request, const ChatTemplate& tpl, const ChatRenderOptions& options) {
  MUSE_ASSIGN_OR_RETURN(ChatPrompt p, render_chat(request, tpl, options));
  return std::move(p.text);
}

}  // namespace muse::chat
