// libFuzzer target: structured output (chat/json_schema_grammar.h).
// The input is `SCHEMA\0OUTPUT` (no NUL: OUTPUT alone, json_object).
// Properties: never crashes; any schema JSON gives a grammar or an error;
// whenever the grammar admits the whole output and it may end there, the
// output parses as JSON (an object for json_object), and every key of a
// top-level object whose schema says additionalProperties false is declared.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "muse/chat/json_schema_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  muse::Json schema;
  const muse::Json* sp = nullptr;
  std::string_view out = in;
  if (nul != std::string_view::npos) {
    out = in.substr(nul + 1);
    auto j = muse::Json::parse(in.substr(0, nul));
    if (j.ok()) {
      schema = std::move(j).value();
      sp = &schema;
    }
  }
  auto g = muse::chat::JsonSchemaGrammar::make(sp);
  if (!g.ok()) return 0;
  auto s = g->initial();
  for (size_t i = 0; i < out.size(); ++i) {
    (void)g->in_plain_string(s);
    if (!g->feed_text(s, out.substr(i, 1))) return 0;
  }
  if (!g->can_end(s)) return 0;
  auto parsed = muse::Json::parse(out);
  if (!parsed.ok()) std::abort();
  if (!sp && !parsed->is_object()) std::abort();
  if (sp && sp->is_object() && parsed->is_object()) {
    const muse::Json* add = sp->find("additionalProperties");
    const muse::Json* props = sp->find("properties");
    if (add && add->is_bool() && !add->as_bool() && props && props->is_object())
      for (const auto& [k, v] : parsed->as_object())
        if (!props->find(k)) std::abort();
  }
  return 0;
}
