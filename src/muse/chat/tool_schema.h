// The request's tools as the response parser needs them: names for
// normalisation (chat-format.md §4.4) and JSON schemas for value decoding
// (§4.3).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse::chat {

struct ToolInfo {
  std::string name;
  Json parameters;  // the JSON schema (an object), or null
};

class ToolSet {
 public:
  ToolSet() = default;
  // OpenAI tools ([{type: function, function: {name, parameters}}]), bare
  // function objects, or Anthropic tools ([{name, input_schema}]).
  static Result<ToolSet> from_json(const Json& tools);
  void add(ToolInfo tool) { tools_.push_back(std::move(tool)); }

  const ToolInfo* find(std::string_view name) const;
  // Exact match, else Ollama's rule (`ns.fn` names registered `fn` when fn's
  // own namespace is ns, so `get_weather.get_weather` -> `get_weather`);
  // no leaf matching. Returns null when unresolved.
  const ToolInfo* resolve(std::string_view name) const;
  bool empty() const { return tools_.empty(); }
  const std::vector<ToolInfo>& tools() const { return tools_; }

 private:
  std::vector<ToolInfo> tools_;
};

// Decodes one ATEM parameter value. `schema` is the parameter's JSON schema
// (null when the parameter or tool is unknown):
//  - a declared type admitting string keeps the raw text; if it also admits
//    null, the exact text `null` is null;
//  - any other declared type parses JSON, falling back to the raw text;
//  - no schema (undeclared): JSON when it parses, else the raw text.
Json decode_parameter_value(std::string_view raw, const Json* schema);

// The parameter's schema inside a tool's parameters schema, or null.
const Json* parameter_schema(const ToolInfo* tool, std::string_view param);

// [A-Za-z0-9_.-]+ (chat-format.md requirement 8).
bool is_valid_tool_name(std::string_view name);

}  // namespace muse::chat
