#include "muse/jinja/jinja.h"

namespace muse::jinja {

Result<Template> Template::parse(std::string_view source, const ParseOptions& options) {
  auto ast = parse_template(source, options);
  if (!ast.ok()) return make_error("chat template syntax error: " + ast.message());
  Template t;
  t.ast_ = std::make_shared<const TemplateAst>(std::move(ast).value());
  return t;
}

Result<std::string> Template::render(const Json& context, const RenderOptions& options, RenderFailure* failure) const {
  if (!context.is_object()) return make_error("chat template context must be a JSON object");
  std::vector<std::pair<std::string, Value>> vars;
  vars.reserve(context.as_object().size());
  for (const auto& [k, v] : context.as_object()) vars.emplace_back(k, from_json(v));
  return render(vars, options, failure);
}

Result<std::string> Template::render(const std::vector<std::pair<std::string, Value>>& context,
                                     const RenderOptions& options, RenderFailure* failure) const {
  Interpreter in(options.limits, options.now_unix_seconds);
  for (const auto& [k, v] : context) in.set_global(k, v);
  try {
    return in.render(*ast_);
  } catch (const TemplateRuntimeError& e) {
    int line = e.line ? e.line : in.current_line();
    if (failure) *failure = RenderFailure{e.kind, line, e.message};
    std::string prefix = e.kind == ErrorKind::Raised ? "chat template raised an exception"
                                                     : std::string("chat template ") + error_kind_name(e.kind);
    return make_error(prefix + " (line " + std::to_string(line) + "): " + e.message);
  }
}

}  // namespace muse::jinja
