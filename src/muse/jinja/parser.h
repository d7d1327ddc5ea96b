// Jinja parser: tokens -> TemplateAst, following jinja2 3.1's grammar
// (operator precedence, tuples, filters/tests with and without arguments,
// slices, call arguments with *args/**kwargs, for/if/set/macro/call/filter/
// with/raw blocks, loop controls, transformers' {% generation %}).
#pragma once

#include <string_view>

#include "muse/core/status.h"
#include "muse/jinja/ast.h"

namespace muse::jinja {

struct ParseOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  // Nesting limit for expressions and blocks, so hostile templates cannot
  // overflow the stack while parsing or rendering.
  int max_nesting = 200;
};

Result<TemplateAst> parse_template(std::string_view source, const ParseOptions& options = {});

}  // namespace muse::jinja
