// Values of the Jinja renderer, with Python semantics.
//
// Chat templates are Python programs in disguise: Hugging Face renders them
// with jinja2, so `{{ 2.0 }}` prints "2.0", `True == 1`, dict order is
// insertion order, `len` counts code points and an undefined name prints as
// nothing. Value mirrors the Python types a template can see (None, bool,
// int, float, str, list, tuple, dict, namespace, loop, callables, Undefined)
// and the helpers below implement the Python operations on them.
//
// Lists, tuples and dicts are immutable once built (Hugging Face uses
// ImmutableSandboxedEnvironment), so they are shared by pointer; only
// namespace() objects mutate, and only through `{% set ns.attr = ... %}`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "muse/core/json.h"

namespace muse::jinja {

class Value;
class Interpreter;
struct CallArgs;

// Why an Undefined is undefined: printed on misuse, like jinja2's
// UndefinedError ("'x' is undefined", "'dict object' has no attribute 'y'").
struct UndefinedInfo {
  std::string message;
  bool security = false;  // sandbox refusal (list.append, ...): SecurityError
};

enum class ListKind : uint8_t { List, Tuple, DictItems, DictKeys, DictValues };

// `depth` is the nesting depth (1 for a flat list), cached so that building
// a structure too deep to print or free recursively can be refused cheaply.
struct ListData {
  std::vector<Value> items;
  ListKind kind = ListKind::List;
  int depth = 1;
};

// Insertion-ordered mapping with Python key equality (1 == 1.0 == True).
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  int depth = 1;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Insert or replace in place (Python dict assignment keeps the first position).
  void set(Value key, Value value);
};

struct NamespaceData {
  DictData attrs;
};

struct LoopData;  // defined by the interpreter (interpreter.h)

class Callable {
 public:
  virtual ~Callable() = default;
  virtual Value call(Interpreter& in, CallArgs& args) = 0;
  virtual std::string repr() const = 0;
  virtual std::string_view type_name() const { return "function"; }
  // Attribute access on the callable object (cycler.next, ...); `self` is
  // the Value holding this callable.
  virtual Value attribute(const Value& self, std::string_view name);
};

struct NoneTag {
  bool operator==(const NoneTag&) const { return true; }
};

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Loop, Callable };

  Value() : v_(std::shared_ptr<const UndefinedInfo>()) {}
  static Value undefined(std::string message, bool security = false);
  static Value none() { return Value(NoneTag{}); }
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(const char* s) : v_(std::make_shared<const std::string>(s)) {}
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}
  Value(std::string_view s) : v_(std::make_shared<const std::string>(s)) {}
  Value(std::shared_ptr<const std::string> s) : v_(std::move(s)) {}
  static Value list(std::vector<Value> items, ListKind kind = ListKind::List);
  static Value dict(DictData d);
  Value(std::shared_ptr<NamespaceData> ns) : v_(std::move(ns)) {}
  Value(std::shared_ptr<LoopData> loop) : v_(std::move(loop)) {}
  Value(std::shared_ptr<Callable> fn) : v_(std::move(fn)) {}

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  // Python's numbers.Number: bool counts (bool is a subclass of int).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::String; }
  bool is_list() const { return kind() == Kind::List; }  // list, tuple, dict views
  bool is_dict() const { return kind() == Kind::Dict; }
  bool is_namespace() const { return kind() == Kind::Namespace; }
  bool is_loop() const { return kind() == Kind::Loop; }
  bool is_callable() const { return kind() == Kind::Callable; }

  const UndefinedInfo* undefined_info() const { return std::get<0>(v_).get(); }
  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return is_bool() ? int64_t(as_bool()) : std::get<int64_t>(v_); }
  double as_double() const;  // int, bool or float
  const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  const ListData& as_list() const { return *std::get<std::shared_ptr<const ListData>>(v_); }
  ListKind list_kind() const { return as_list().kind; }
  const std::vector<Value>& items() const { return as_list().items; }
  const DictData& as_dict() const { return *std::get<std::shared_ptr<const DictData>>(v_); }
  NamespaceData& as_namespace() const { return *std::get<std::shared_ptr<NamespaceData>>(v_); }
  LoopData& as_loop() const { return *std::get<std::shared_ptr<LoopData>>(v_); }
  const std::shared_ptr<LoopData>& loop_ptr() const { return std::get<std::shared_ptr<LoopData>>(v_); }
  Callable& as_callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  // Identity, for `is sameas` and `changed()`.
  const void* identity() const;
  // Nesting depth: lists/dicts report their cached depth, everything else 0.
  int depth() const;

 private:
  explicit Value(NoneTag t) : v_(t) {}
  using Storage = std::variant<std::shared_ptr<const UndefinedInfo>, NoneTag, bool, int64_t, double,
                               std::shared_ptr<const std::string>, std::shared_ptr<const ListData>,
                               std::shared_ptr<const DictData>, std::shared_ptr<NamespaceData>,
                               std::shared_ptr<LoopData>, std::shared_ptr<Callable>>;
  Storage v_;
};

// ---------------------------------------------------------------------------
// Python semantics. Functions that can fail raise a TemplateRuntimeError
// (error.h) caught at the render boundary.
// ---------------------------------------------------------------------------

// Python type name as in error messages: "str", "int", "NoneType", "dict", ...
std::string type_name(const Value& v);
// The "'dict object'" phrase jinja2 uses in "has no attribute" messages.
std::string object_description(const Value& v);
bool truthy(const Value& v);
// str(v): what `{{ v }}` prints. Undefined prints as "".
std::string to_str(const Value& v);
void append_str(std::string& out, const Value& v);
// repr(v): how values print inside containers.
std::string repr(const Value& v);
void append_repr(std::string& out, const Value& v);
// Python ==, never fails.
bool equals(const Value& a, const Value& b);
// Python <: fails on incomparable types ("'<' not supported between ...").
bool less_than(const Value& a, const Value& b, const char* op = "<");
// Python's int(): parses strings ("42", " -7 "), truncates floats.
bool python_int_from_string(std::string_view s, int64_t* out, int base = 10);

// Conversion from/to the JSON DOM. Objects keep their key order; integers
// stay distinct from floats (2 vs 2.0).
Value from_json(const Json& j);
// Lists/tuples become arrays, dicts with string keys objects; other values
// (undefined, callables) become null. For tests and the request path.
Json to_json(const Value& v);

}  // namespace muse::jinja
