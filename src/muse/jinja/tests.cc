// Jinja's built-in tests (jinja2.tests): `x is defined`, `x is mapping`, ...
#include <cmath>
#include <unordered_map>

#include "muse/jinja/builtins.h"
#include "muse/jinja/filters_internal.h"
#include "muse/jinja/interpreter.h"
#include "muse/jinja/unicode.h"

namespace muse::jinja {

using namespace filters;

namespace {

const Value& one_arg(CallArgs& a, const char* test) {
  if (a.args.size() != 1 || !a.kwargs.empty())
    type_error(std::string("test '") + test + "' takes exactly one argument");
  return a.args[0];
}

void no_args(CallArgs& a, const char* test) {
  if (!a.args.empty() || !a.kwargs.empty()) type_error(std::string("test '") + test + "' takes no arguments");
}

#define SIMPLE_TEST(fn, name, expr)                  \
  bool fn(Interpreter&, const Value& v, CallArgs& a) { \
    no_args(a, name);                                \
    return (expr);                                   \
  }

SIMPLE_TEST(t_defined, "defined", !v.is_undefined())
SIMPLE_TEST(t_undefined, "undefined", v.is_undefined())
SIMPLE_TEST(t_none, "none", v.is_none())
SIMPLE_TEST(t_boolean, "boolean", v.is_bool())
SIMPLE_TEST(t_false, "false", v.is_bool() && !v.as_bool())
SIMPLE_TEST(t_true, "true", v.is_bool() && v.as_bool())
SIMPLE_TEST(t_integer, "integer", v.is_int())
SIMPLE_TEST(t_float, "float", v.is_float())
SIMPLE_TEST(t_number, "number", v.is_number())
SIMPLE_TEST(t_string, "string", v.is_string())
SIMPLE_TEST(t_mapping, "mapping", v.is_dict())
SIMPLE_TEST(t_escaped, "escaped", false)
// Undefined is iterable (empty), callable and a sequence in jinja2, because
// the Undefined class defines __iter__, __call__, __len__ and __getitem__.
SIMPLE_TEST(t_iterable, "iterable", v.is_list() || v.is_dict() || v.is_string() || v.is_undefined() || v.is_loop())
SIMPLE_TEST(t_sequence, "sequence",
            v.is_string() || v.is_dict() || v.is_undefined() ||
                (v.is_list() && (v.list_kind() == ListKind::List || v.list_kind() == ListKind::Tuple)))
SIMPLE_TEST(t_callable, "callable", v.is_callable() || v.is_loop() || v.is_undefined())

bool cased_test(const Value& v, bool want_lower) {
  std::string s = to_str(v);
  bool any_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    uint32_t c = next_code_point(s, &pos);
    if (want_lower ? is_upper_cp(c) : is_lower_cp(c)) return false;
    if (is_upper_cp(c) || is_lower_cp(c)) any_cased = true;
  }
  return any_cased;
}

bool t_lower(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "lower");
  return cased_test(v, true);
}
bool t_upper(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "upper");
  return cased_test(v, false);
}

Value python_mod(Interpreter& in, const Value& x, const Value& y) {
  if (!x.is_number() || !y.is_number()) {
    fail_if_undefined(x);
    fail_if_undefined(y);
    type_error("unsupported operand type(s) for %: '" + type_name(x) + "' and '" + type_name(y) + "'");
  }
  (void)in;
  if (x.is_float() || y.is_float()) {
    if (y.as_double() == 0) type_error("float modulo");
    double m = std::fmod(x.as_double(), y.as_double());
    if (m != 0 && ((m < 0) != (y.as_double() < 0))) m += y.as_double();
    return Value(m);
  }
  if (y.as_int() == 0) type_error("integer modulo by zero");
  if (y.as_int() == -1) return Value(int64_t(0));
  int64_t m = x.as_int() % y.as_int();
  if (m != 0 && ((m < 0) != (y.as_int() < 0))) m += y.as_int();
  return Value(m);
}

bool t_divisibleby(Interpreter& in, const Value& v, CallArgs& a) {
  return equals(python_mod(in, v, one_arg(a, "divisibleby")), Value(int64_t(0)));
}
bool t_even(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(a, "even");
  return equals(python_mod(in, v, Value(int64_t(2))), Value(int64_t(0)));
}
bool t_odd(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(a, "odd");
  return equals(python_mod(in, v, Value(int64_t(2))), Value(int64_t(1)));
}

bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return equals(v, one_arg(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !equals(v, one_arg(a, "ne")); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return less_than(v, one_arg(a, "lt"), "<"); }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return less_than(one_arg(a, "gt"), v, ">"); }
bool t_le(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = one_arg(a, "le");
  return less_than(v, o, "<=") || equals(v, o);
}
bool t_ge(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = one_arg(a, "ge");
  return less_than(o, v, ">=") || equals(v, o);
}
bool t_in(Interpreter&, const Value& v, CallArgs& a) { return python_contains(one_arg(a, "in"), v); }

bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = one_arg(a, "sameas");
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::None:
    case Value::Kind::Undefined: return v.is_none() || v.undefined_info() == o.undefined_info();
    case Value::Kind::Bool:
    case Value::Kind::Int: return v.as_int() == o.as_int();
    case Value::Kind::Float: return false;  // distinct float objects
    default: return v.identity() == o.identity();
  }
}

bool t_filter(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "filter");
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool t_test(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "test");
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

}  // namespace

TestFn find_test(std::string_view name) {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined}, {"divisibleby", t_divisibleby},
      {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"escaped", t_escaped}, {"even", t_even}, {"false", t_false},
      {"filter", t_filter}, {"float", t_float}, {"ge", t_ge}, {">=", t_ge}, {"greaterthan", t_gt}, {"gt", t_gt},
      {">", t_gt}, {"in", t_in}, {"integer", t_integer}, {"iterable", t_iterable}, {"le", t_le}, {"<=", t_le},
      {"lessthan", t_lt}, {"lt", t_lt}, {"<", t_lt}, {"lower", t_lower}, {"mapping", t_mapping}, {"ne", t_ne},
      {"!=", t_ne}, {"none", t_none}, {"number", t_number}, {"odd", t_odd}, {"sameas", t_sameas},
      {"sequence", t_sequence}, {"string", t_string}, {"test", t_test}, {"true", t_true},
      {"undefined", t_undefined}, {"upper", t_upper},
  };
  auto it = table.find(name);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace muse::jinja
