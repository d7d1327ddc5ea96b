// Registries of the built-in filters, tests, global functions and Python
// methods (str/dict/list) a template can use. Implemented across
// filters*.cc, tests.cc, methods.cc and globals.cc.
#pragma once

#include <string_view>

#include "muse/jinja/ast.h"

namespace muse::jinja {

FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

// Python methods reachable as attributes: "abc".upper, d.items, l.index, ...
// `has_method` tells attribute lookup whether to return a bound method.
bool has_method(const Value& self, std::string_view name);
// Mutating methods the immutable sandbox refuses (list.append, dict.update, ...).
bool is_unsafe_method(const Value& self, std::string_view name);
Value call_method(Interpreter& in, const Value& self, std::string_view name, CallArgs& args);
Value bound_method(const Value& self, std::string_view name);

// Globals of every render: range, dict, namespace, joiner, cycler, lipsum,
// plus transformers' raise_exception and strftime_now.
void add_globals(Interpreter& in);

// JSON text of a value the way transformers' tojson filter writes it:
// json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...).
struct JsonDumpStyle {
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_indent = false;
  std::string indent;  // the unit repeated per level (int indent -> spaces)
  std::string item_separator = ", ";
  std::string key_separator = ": ";
};
void dump_json(std::string& out, const Value& v, const JsonDumpStyle& style, int level = 0);

// ---------------------------------------------------------------------------
// Argument binding for built-ins: positional-or-keyword parameters by name.
// ---------------------------------------------------------------------------
class ArgBinder {
 public:
  // `params` are the parameter names after the input value; errors name `fn`.
  ArgBinder(std::string_view fn, CallArgs& args, std::initializer_list<std::string_view> params);
  // The bound value, or undefined when not given.
  const Value& operator[](size_t i) const { return values_[i]; }
  bool given(size_t i) const { return !values_[i].is_undefined() || given_[i]; }

 private:
  std::vector<Value> values_;
  std::vector<bool> given_;
};

}  // namespace muse::jinja
