#include "muse/chat/tool_schema.h"

namespace muse::chat {

Result<ToolSet> ToolSet::from_json(const Json& tools) {
  ToolSet set;
  if (tools.is_null()) return set;
  if (!tools.is_array()) return make_error("'tools' must be an array");
  for (size_t i = 0; i < tools.as_array().size(); ++i) {
    const Json& t = tools.as_array()[i];
    if (!t.is_object()) return make_error("tools[" + std::to_string(i) + "] must be an object");
    const Json* fn = t.find("function");
    if (!fn || !fn->is_object()) fn = &t;
    const Json* name = fn->find("name");
    if (!name || !name->is_string())
      return make_error("tools[" + std::to_string(i) + "] needs a string 'name'");
    ToolInfo info;
    info.name = name->as_string();
    if (const Json* p = fn->find("parameters")) info.parameters = *p;
    else if (const Json* s = fn->find("input_schema")) info.parameters = *s;
    set.tools_.push_back(std::move(info));
  }
  return set;
}

const ToolInfo* ToolSet::find(std::string_view name) const {
  for (const auto& t : tools_)
    if (t.name == name) return &t;
  return nullptr;
}

const ToolInfo* ToolSet::resolve(std::string_view name) const {
  if (const ToolInfo* t = find(name)) return t;
  size_t dot = name.find('.');
  if (dot == std::string_view::npos) return nullptr;
  std::string_view ns = name.substr(0, dot), rest = name.substr(dot + 1);
  const ToolInfo* t = find(rest);
  if (!t) return nullptr;
  std::string_view own_ns = std::string_view(t->name).substr(0, t->name.find('.'));
  return own_ns == ns ? t : nullptr;
}

bool is_valid_tool_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-';
    if (!ok) return false;
  }
  return true;
}

const Json* parameter_schema(const ToolInfo* tool, std::string_view param) {
  if (!tool || !tool->parameters.is_object()) return nullptr;
  const Json* props = tool->parameters.find("properties");
  if (!props || !props->is_object()) return nullptr;
  return props->find(param);
}

namespace {

// Which JSON types a schema admits; `declared` is false when it says nothing.
struct Admits {
  bool declared = false, string = false, null = false, other = false;
};

void collect(const Json& schema, Admits& a, int depth) {
  if (!schema.is_object() || depth > 8) return;
  if (const Json* type = schema.find("type")) {
    auto add = [&](const Json& t) {
      if (!t.is_string()) return;
      a.declared = true;
      if (t.as_string() == "string") a.string = true;
      else if (t.as_string() == "null") a.null = true;
      else a.other = true;
    };
    if (type->is_array())
      for (const auto& t : type->as_array()) add(t);
    else
      add(*type);
  }
  if (const Json* nullable = schema.find("nullable"); nullable && nullable->is_bool() && nullable->as_bool())
    a.null = true;
  if (const Json* en = schema.find("enum"); en && en->is_array()) {
    for (const auto& v : en->as_array()) {
      a.declared = true;
      if (v.is_string()) a.string = true;
      else if (v.is_null()) a.null = true;
      else a.other = true;
    }
  }
  if (const Json* c = schema.find("const")) {
    a.declared = true;
    (c->is_string() ? a.string : c->is_null() ? a.null : a.other) = true;
  }
  for (const char* key : {"anyOf", "oneOf", "allOf"})
    if (const Json* alts = schema.find(key); alts && alts->is_array())
      for (const auto& s : alts->as_array()) collect(s, a, depth + 1);
}

}  // namespace

Json decode_parameter_value(std::string_view raw, const Json* schema) {
  Admits a;
  if (schema) collect(*schema, a, 0);
  if (a.declared && a.string) {
    if (a.null && raw == "null") return Json();
    return Json(std::string(raw));
  }
  auto parsed = Json::parse(raw);
  if (parsed.ok()) return std::move(parsed).value();
  return Json(std::string(raw));
}

}  // namespace muse::chat
