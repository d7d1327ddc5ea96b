// Helpers shared by the filter, test and method implementations.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "muse/jinja/ast.h"

namespace muse::jinja {
namespace filters {

// Raises the undefined value's own error (UndefinedError semantics).
void fail_if_undefined(const Value& v);
std::string str_arg(const Value& v, std::string_view what);
int64_t int_arg(const Value& v, std::string_view what);
// Python str.splitlines (all of Python's line boundaries).
std::vector<std::string> splitlines(const std::string& s, bool keepends);
std::string html_escape(std::string_view s);
// Python str.replace, including the empty-pattern case; count < 0: all.
std::string python_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count);
bool parse_python_float(const std::string& text, double* out);

}  // namespace filters

void add_sequence_filters(std::unordered_map<std::string_view, FilterFn>& table);

}  // namespace muse::jinja
