// A Jinja2 renderer for chat templates, set up like Hugging Face's
// apply_chat_template (transformers' _compile_jinja_template):
// trim_blocks and lstrip_blocks on, an immutable sandbox, Jinja's default
// lenient Undefined, loop controls, {% generation %}, tojson as
// json.dumps(ensure_ascii=False) with indent/separators/sort_keys, and the
// raise_exception / strftime_now globals. docs/chat.md lists the supported
// subset and the known deviations from Python.
//
//   MUSE_ASSIGN_OR_RETURN(auto tpl, jinja::Template::parse(text));
//   MUSE_ASSIGN_OR_RETURN(std::string out, tpl.render(context_json));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/jinja/error.h"
#include "muse/jinja/interpreter.h"
#include "muse/jinja/parser.h"
#include "muse/jinja/value.h"

namespace muse::jinja {

struct RenderOptions {
  RenderLimits limits;
  // Fixed clock for strftime_now (seconds since the epoch, formatted as UTC);
  // unset: the server's local time, as transformers does.
  std::optional<int64_t> now_unix_seconds;
};

// What went wrong in a failed render, for callers that distinguish a
// template's own raise_exception (a client error) from a broken template.
struct RenderFailure {
  ErrorKind kind = ErrorKind::Type;
  int line = 0;
  std::string message;  // without the line prefix
};

class Template {
 public:
  static Result<Template> parse(std::string_view source, const ParseOptions& options = {});

  // `context` must be an object: its members become the template's variables.
  Result<std::string> render(const Json& context, const RenderOptions& options = {},
                             RenderFailure* failure = nullptr) const;
  // The same with already converted values (name, value) pairs.
  Result<std::string> render(const std::vector<std::pair<std::string, Value>>& context,
                             const RenderOptions& options = {}, RenderFailure* failure = nullptr) const;

 private:
  std::shared_ptr<const TemplateAst> ast_;
};

}  // namespace muse::jinja
