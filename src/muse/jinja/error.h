// Errors inside the Jinja renderer.
//
// The lexer, parser and evaluator are deeply recursive, so they report
// failures with one internal exception type that never leaves this folder:
// Template::parse and Template::render catch it and return a Result whose
// message carries the template line ("line 12: 'foo' is undefined").
#pragma once

#include <string>

namespace muse::jinja {

enum class ErrorKind {
  Syntax,     // TemplateSyntaxError: the template text is malformed
  Undefined,  // UndefinedError: an undefined value was used
  Type,       // TypeError / ValueError and friends at render time
  Security,   // the sandbox refused an operation
  Raised,     // the template called raise_exception(msg)
  Limit,      // a rendering limit (steps, depth, output size) was hit
};

const char* error_kind_name(ErrorKind kind);

struct TemplateRuntimeError {
  ErrorKind kind;
  std::string message;
  int line = 0;  // 0: filled in from the statement being executed
};

[[noreturn]] void raise(ErrorKind kind, std::string message, int line = 0);
[[noreturn]] inline void type_error(std::string message) { raise(ErrorKind::Type, std::move(message)); }

}  // namespace muse::jinja
