// Jinja lexer with Hugging Face's settings (trim_blocks, lstrip_blocks, no
// keep_trailing_newline), following jinja2 3.1's lexer rule for rule:
// newlines are normalised to "\n", one trailing newline is dropped, `{%-`
// strips the preceding whitespace, lstrip_blocks strips a block tag's
// indentation, trim_blocks eats the newline after `%}` and `#}`, `+`
// disables either, `{% raw %}` passes text through, and `}}`/`%}` only end a
// tag when brackets are balanced.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/status.h"

namespace muse::jinja {

enum class TokenType : uint8_t {
  Data,
  VariableBegin,
  VariableEnd,
  BlockBegin,
  BlockEnd,
  Name,
  String,
  Integer,
  Float,
  Operator,
  Eof,
};

struct Token {
  TokenType type;
  std::string value;  // Data text, names, unescaped strings, operator spelling
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Tokenizes a whole template. Errors are TemplateSyntaxError-like messages
// with the line number; the source must be valid UTF-8.
Result<std::vector<Token>> tokenize(std::string_view source, const LexerOptions& options = {});

const char* token_type_name(TokenType t);
// jinja2's describe_token: "end of print statement", "'name'", ...
std::string describe_token(const Token& t);

}  // namespace muse::jinja
