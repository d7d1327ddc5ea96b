#include "muse/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "muse/jinja/error.h"
#include "muse/jinja/interpreter.h"
#include "muse/jinja/unicode.h"

namespace muse::jinja {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Syntax: return "syntax error";
    case ErrorKind::Undefined: return "undefined value";
    case ErrorKind::Type: return "error";
    case ErrorKind::Security: return "sandbox violation";
    case ErrorKind::Raised: return "raise_exception";
    case ErrorKind::Limit: return "limit exceeded";
  }
  return "error";
}

void raise(ErrorKind kind, std::string message, int line) {
  throw TemplateRuntimeError{kind, std::move(message), line};
}

// ---------------------------------------------------------------------------
// Construction and containers
// ---------------------------------------------------------------------------

Value Value::undefined(std::string message, bool security) {
  Value v;
  v.v_ = std::make_shared<const UndefinedInfo>(UndefinedInfo{std::move(message), security});
  return v;
}

Value Value::list(std::vector<Value> items, ListKind kind) {
  int depth = 0;
  for (const auto& item : items) depth = std::max(depth, item.depth());
  Value v;
  v.v_ = std::make_shared<const ListData>(ListData{std::move(items), kind, depth + 1});
  return v;
}

Value Value::dict(DictData d) {
  int depth = 0;
  for (const auto& [k, item] : d.items) depth = std::max({depth, k.depth(), item.depth()});
  d.depth = depth + 1;
  Value v;
  v.v_ = std::make_shared<const DictData>(std::move(d));
  return v;
}

int Value::depth() const {
  if (is_list()) return as_list().depth;
  if (is_dict()) return as_dict().depth;
  return 0;
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(v_);
  return double(as_int());
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::String: return std::get<std::shared_ptr<const std::string>>(v_).get();
    case Kind::List: return std::get<std::shared_ptr<const ListData>>(v_).get();
    case Kind::Dict: return std::get<std::shared_ptr<const DictData>>(v_).get();
    case Kind::Namespace: return std::get<std::shared_ptr<NamespaceData>>(v_).get();
    case Kind::Loop: return std::get<std::shared_ptr<LoopData>>(v_).get();
    case Kind::Callable: return std::get<std::shared_ptr<Callable>>(v_).get();
    default: return nullptr;
  }
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

const Value* DictData::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

void DictData::set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Callable::attribute(const Value& self, std::string_view name) {
  return Value::undefined("'" + object_description(self) + "' has no attribute '" + std::string(name) + "'");
}

// ---------------------------------------------------------------------------
// Python semantics
// ---------------------------------------------------------------------------

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List:
      switch (v.list_kind()) {
        case ListKind::List: return "list";
        case ListKind::Tuple: return "tuple";
        case ListKind::DictItems: return "dict_items";
        case ListKind::DictKeys: return "dict_keys";
        case ListKind::DictValues: return "dict_values";
      }
      return "list";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Loop: return "LoopContext";
    case Value::Kind::Callable: return std::string(v.as_callable().type_name());
  }
  return "object";
}

std::string object_description(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_namespace()) return "jinja2.utils.Namespace object";
  if (v.is_loop()) return "jinja2.runtime.LoopContext object";
  return type_name(v) + " object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.as_bool();
    case Value::Kind::Int: return v.as_int() != 0;
    case Value::Kind::Float: return v.as_double() != 0.0;
    case Value::Kind::String: return !v.as_string().empty();
    case Value::Kind::List: return !v.items().empty();
    case Value::Kind::Dict: return !v.as_dict().items.empty();
    default: return true;
  }
}

namespace {

void append_float_str(std::string& out, double d) {
  if (std::isnan(d)) {
    out += "nan";
  } else if (std::isinf(d)) {
    out += d < 0 ? "-inf" : "inf";
  } else {
    format_python_float(out, d);
  }
}

bool is_printable(uint32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c <= 0xA0 || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
      (c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB))
    return false;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x180E) return false;
  if ((c >= 0xD800 && c <= 0xF8FF) || c >= 0xF0000) return false;  // surrogates, private use
  return true;
}

void append_string_repr(std::string& out, std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  out.push_back(quote);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    uint32_t c = next_code_point(s, &pos);
    if (c == uint32_t(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!is_printable(c)) {
      char buf[16];
      if (c <= 0xFF)
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
      else if (c <= 0xFFFF)
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", c);
      out += buf;
    } else {
      out.append(s.substr(start, pos - start));
    }
  }
  out.push_back(quote);
}

void append_items(std::string& out, const std::vector<Value>& items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    append_repr(out, items[i]);
  }
}

void append_dict_repr(std::string& out, const DictData& d) {
  out.push_back('{');
  for (size_t i = 0; i < d.items.size(); ++i) {
    if (i) out += ", ";
    append_repr(out, d.items[i].first);
    out += ": ";
    append_repr(out, d.items[i].second);
  }
  out.push_back('}');
}

}  // namespace

// Namespaces are mutable, so they can contain themselves; printing them
// must stop somewhere (Python raises RecursionError near this depth).
struct ReprDepthGuard {
  static thread_local int depth;
  ReprDepthGuard() {
    if (++depth > 500) {
      depth = 0;
      raise(ErrorKind::Limit, "maximum recursion depth exceeded while printing a value");
    }
  }
  ~ReprDepthGuard() { if (depth > 0) --depth; }
};
thread_local int ReprDepthGuard::depth = 0;

void append_repr(std::string& out, const Value& v) {
  ReprDepthGuard guard;
  switch (v.kind()) {
    case Value::Kind::Undefined: out += "Undefined"; return;
    case Value::Kind::String: append_string_repr(out, v.as_string()); return;
    case Value::Kind::List: {
      const auto& items = v.items();
      switch (v.list_kind()) {
        case ListKind::List:
          out.push_back('[');
          append_items(out, items);
          out.push_back(']');
          return;
        case ListKind::Tuple:
          out.push_back('(');
          append_items(out, items);
          if (items.size() == 1) out.push_back(',');
          out.push_back(')');
          return;
        case ListKind::DictItems: out += "dict_items(["; break;
        case ListKind::DictKeys: out += "dict_keys(["; break;
        case ListKind::DictValues: out += "dict_values(["; break;
      }
      append_items(out, items);
      out += "])";
      return;
    }
    case Value::Kind::Dict: append_dict_repr(out, v.as_dict()); return;
    case Value::Kind::Namespace:
      out += "<Namespace ";
      append_dict_repr(out, v.as_namespace().attrs);
      out += ">";
      return;
    default: append_str(out, v); return;
  }
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return;
    case Value::Kind::None: out += "None"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "True" : "False"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: append_float_str(out, v.as_double()); return;
    case Value::Kind::String: out += v.as_string(); return;
    case Value::Kind::Loop: {
      const LoopData& l = v.as_loop();
      out += "<LoopContext " + std::to_string(l.index0 + 1) + "/" + std::to_string(l.length) + ">";
      return;
    }
    case Value::Kind::Callable: out += v.as_callable().repr(); return;
    default: append_repr(out, v); return;
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.as_string();
  std::string out;
  append_str(out, v);
  return out;
}

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.as_string() == b.as_string();
    case K::List: {
      const auto &x = a.as_list(), &y = b.as_list();
      bool a_seq = x.kind == ListKind::List || x.kind == ListKind::Tuple;
      bool b_seq = y.kind == ListKind::List || y.kind == ListKind::Tuple;
      if ((a_seq || b_seq) && x.kind != y.kind) return false;
      if (x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equals(x.items[i], y.items[i])) return false;
      return true;
    }
    case K::Dict: {
      const auto &x = a.as_dict(), &y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

bool less_than(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.list_kind() == b.list_kind() &&
      (a.list_kind() == ListKind::List || a.list_kind() == ListKind::Tuple)) {
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return less_than(x[i], y[i], op);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined() || b.is_undefined()) {
    const Value& u = a.is_undefined() ? a : b;
    raise(ErrorKind::Undefined, u.undefined_info() ? u.undefined_info()->message : "value is undefined");
  }
  type_error(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
             type_name(b) + "'");
}

bool python_int_from_string(std::string_view s, int64_t* out, int base) {
  std::string_view t = strip_view(s, nullptr, true, true);
  bool neg = false;
  if (!t.empty() && (t[0] == '+' || t[0] == '-')) {
    neg = t[0] == '-';
    t.remove_prefix(1);
  }
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (t.size() > 2 && t[0] == '0') {
      char p = char(t[1] | 32);
      int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (prefixed && (base == 0 || base == prefixed)) {
        base = prefixed;
        t.remove_prefix(2);
        if (!t.empty() && t[0] == '_') t.remove_prefix(1);
      }
    }
    if (base == 0) base = 10;
  }
  if (t.empty() || t.front() == '_' || t.back() == '_') return false;
  unsigned __int128 acc = 0;
  char prev = 0;
  for (char c : t) {
    if (c == '_') {
      if (prev == '_') return false;
      prev = c;
      continue;
    }
    int d = (c >= '0' && c <= '9') ? c - '0' : ((c | 32) >= 'a' && (c | 32) <= 'z') ? (c | 32) - 'a' + 10 : 99;
    if (d >= base) return false;
    acc = acc * unsigned(base) + unsigned(d);
    if (acc > (unsigned __int128)(INT64_MAX) + 1) return false;
    prev = c;
  }
  if (!neg && acc > (unsigned __int128)INT64_MAX) return false;
  *out = neg ? int64_t(-(__int128)acc) : int64_t(acc);
  return true;
}

// ---------------------------------------------------------------------------
// JSON bridge
// ---------------------------------------------------------------------------

Value from_json(const Json& j) {
  switch (j.type()) {
    case Json::Type::Null: return Value::none();
    case Json::Type::Bool: return Value(j.as_bool());
    case Json::Type::Int: return Value(j.as_int());
    case Json::Type::Double: return Value(j.as_double());
    case Json::Type::String: return Value(j.as_string());
    case Json::Type::Array: {
      std::vector<Value> items;
      items.reserve(j.as_array().size());
      for (const auto& e : j.as_array()) items.push_back(from_json(e));
      return Value::list(std::move(items));
    }
    case Json::Type::Object: {
      DictData d;
      d.items.reserve(j.as_object().size());
      for (const auto& [k, v] : j.as_object()) d.items.emplace_back(Value(k), from_json(v));
      return Value::dict(std::move(d));
    }
  }
  return Value::none();
}

Json to_json(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Bool: return Json(v.as_bool());
    case Value::Kind::Int: return Json(v.as_int());
    case Value::Kind::Float: return Json(v.as_double());
    case Value::Kind::String: return Json(v.as_string());
    case Value::Kind::List: {
      JsonArray a;
      for (const auto& e : v.items()) a.push_back(to_json(e));
      return Json(std::move(a));
    }
    case Value::Kind::Dict: {
      JsonObject o;
      for (const auto& [k, e] : v.as_dict().items) o.emplace_back(to_str(k), to_json(e));
      return Json(std::move(o));
    }
    default: return Json();
  }
}

}  // namespace muse::jinja
