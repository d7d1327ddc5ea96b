// Expressions: names, attribute/item access (jinja2's sandboxed getattr and
// getitem), slicing, Python operators and comparisons.
#include <cmath>
#include <cstdio>
#include <limits>

#include "muse/jinja/builtins.h"
#include "muse/jinja/interpreter.h"
#include "muse/jinja/unicode.h"

namespace muse::jinja {

namespace {

[[noreturn]] void fail_undefined(const Value& v) {
  const UndefinedInfo* info = v.undefined_info();
  raise(info && info->security ? ErrorKind::Security : ErrorKind::Undefined,
        info ? info->message : "value is undefined");
}

std::string quoted_repr(std::string_view s) { return repr(Value(s)); }

Value no_attribute(const Value& obj, std::string_view attr) {
  return Value::undefined("'" + object_description(obj) + "' has no attribute " + quoted_repr(attr));
}

Value no_element(const Value& obj, const Value& key) {
  return Value::undefined(object_description(obj) + " has no element " + repr(key));
}

[[noreturn]] void unsupported_operands(const char* op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  type_error(std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" + type_name(b) +
             "'");
}

[[noreturn]] void int_overflow() {
  type_error("integer result does not fit in 64 bits (Python's big integers are not supported)");
}

int64_t checked_repeat_count(Interpreter& in, int64_t n, size_t unit) {
  if (n <= 0 || unit == 0) return 0;  // "" * 10**18 is "" at once
  if (unit && uint64_t(n) > in.limits().max_output_bytes / unit)
    raise(ErrorKind::Limit, "repetition result longer than the output limit");
  return n;
}

Value repeat(Interpreter& in, const Value& seq, int64_t n) {
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    n = checked_repeat_count(in, n, s.size());
    std::string out;
    out.reserve(s.size() * size_t(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return in.make_string(std::move(out));
  }
  const auto& items = seq.items();
  n = checked_repeat_count(in, n, items.size() * sizeof(Value));
  std::vector<Value> out;
  out.reserve(items.size() * size_t(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return in.make_list(std::move(out), seq.list_kind());
}

double python_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

bool is_sequence_list(const Value& v) {
  return v.is_list() && (v.list_kind() == ListKind::List || v.list_kind() == ListKind::Tuple);
}

Value loop_attribute(const Value& loop_value, std::string_view attr) {
  const LoopData& l = loop_value.as_loop();
  if (attr == "index") return Value(l.index0 + 1);
  if (attr == "index0") return Value(l.index0);
  if (attr == "revindex") return Value(l.length - l.index0);
  if (attr == "revindex0") return Value(l.length - l.index0 - 1);
  if (attr == "first") return Value(l.index0 == 0);
  if (attr == "last") return Value(l.index0 == l.length - 1);
  if (attr == "length") return Value(l.length);
  if (attr == "depth") return Value(int64_t(l.depth0) + 1);
  if (attr == "depth0") return Value(int64_t(l.depth0));
  if (attr == "previtem")
    return l.index0 > 0 ? l.items[size_t(l.index0 - 1)] : Value::undefined("there is no previous item");
  if (attr == "nextitem")
    return l.index0 + 1 < l.length ? l.items[size_t(l.index0 + 1)] : Value::undefined("there is no next item");
  if (attr == "cycle" || attr == "changed") return bound_method(loop_value, attr);
  return no_attribute(loop_value, attr);
}

}  // namespace

Value python_add(Interpreter& in, const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_double() + b.as_double());
    int64_t r;
    if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) int_overflow();
    return Value(r);
  }
  if (a.is_string() && b.is_string()) {
    if (a.as_string().size() + b.as_string().size() > in.limits().max_output_bytes)
      raise(ErrorKind::Limit, "string longer than the output limit");
    return in.make_string(a.as_string() + b.as_string());
  }
  if (is_sequence_list(a) && is_sequence_list(b) && a.list_kind() == b.list_kind()) {
    std::vector<Value> items = a.items();
    items.insert(items.end(), b.items().begin(), b.items().end());
    return in.make_list(std::move(items), a.list_kind());
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_string()) type_error("can only concatenate str (not \"" + type_name(b) + "\") to str");
  if (is_sequence_list(a) && a.list_kind() == ListKind::List)
    type_error("can only concatenate list (not \"" + type_name(b) + "\") to list");
  if (is_sequence_list(a)) type_error("can only concatenate tuple (not \"" + type_name(b) + "\") to tuple");
  unsupported_operands("+", a, b);
}

bool python_contains(const Value& container, const Value& needle) {
  switch (container.kind()) {
    case Value::Kind::String:
      if (!needle.is_string())
        type_error("'in <string>' requires string as left operand, not " + type_name(needle));
      return container.as_string().find(needle.as_string()) != std::string::npos;
    case Value::Kind::List:
      for (const auto& item : container.items())
        if (equals(item, needle)) return true;
      return false;
    case Value::Kind::Dict:
      if (needle.is_list() || needle.is_dict()) type_error("unhashable type: '" + type_name(needle) + "'");
      return container.as_dict().find(needle) != nullptr;
    case Value::Kind::Undefined: return false;
    default: type_error("argument of type '" + type_name(container) + "' is not iterable");
  }
}

// ---------------------------------------------------------------------------
// Attribute and item access
// ---------------------------------------------------------------------------

Value Interpreter::getattr(const Value& obj, std::string_view attr) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_loop()) return loop_attribute(obj, attr);
  if (obj.is_callable()) return obj.as_callable().attribute(obj, attr);
  // Python attributes (methods) first, as jinja2's sandboxed getattr does:
  // `d.items` is the method even when the dict has an "items" key.
  if (has_method(obj, attr)) return bound_method(obj, attr);
  if (is_unsafe_method(obj, attr))
    return Value::undefined("access to attribute " + quoted_repr(attr) + " of '" + type_name(obj) +
                                "' object is unsafe.",
                            true);
  if (obj.is_number()) {  // the data attributes of Python's int/float
    if (attr == "real") return obj.is_float() ? obj : Value(obj.as_int());
    if (attr == "imag") return obj.is_float() ? Value(0.0) : Value(int64_t(0));
    if (!obj.is_float() && attr == "numerator") return Value(obj.as_int());
    if (!obj.is_float() && attr == "denominator") return Value(int64_t(1));
  }
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(attr)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.as_namespace().attrs.find(attr)) return *v;
  }
  return no_attribute(obj, attr);
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::Undefined: fail_undefined(obj);
    case Value::Kind::Dict:
      if (key.is_list() && key.list_kind() != ListKind::Tuple) break;
      if (const Value* v = obj.as_dict().find(key)) return *v;
      break;
    case Value::Kind::List:
    case Value::Kind::String: {
      if (obj.is_list() && !is_sequence_list(obj)) break;
      if (!key.is_int() && !key.is_bool()) break;
      int64_t i = key.as_int();
      if (obj.is_list()) {
        int64_t n = int64_t(obj.items().size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.items()[size_t(i)];
        return no_element(obj, key);
      }
      const std::string& s = obj.as_string();
      if (is_ascii(s)) {
        int64_t n = int64_t(s.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value(std::string(1, s[size_t(i)]));
        return no_element(obj, key);
      }
      auto offs = code_point_offsets(s);
      int64_t n = int64_t(offs.size()) - 1;
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value(s.substr(offs[size_t(i)], offs[size_t(i) + 1] - offs[size_t(i)]));
      return no_element(obj, key);
    }
    default: break;
  }
  // jinja2 falls back to getattr for string keys.
  if (key.is_string()) {
    if (obj.is_dict()) {
      if (has_method(obj, key.as_string())) return bound_method(obj, key.as_string());
      return no_attribute(obj, key.as_string());
    }
    return getattr(obj, key.as_string());
  }
  return no_element(obj, key);
}

Value Interpreter::slice(const Value& obj, const SliceExpr& s, const FramePtr& frame) {
  bool bad_index = false;
  auto bound = [&](const ExprPtr& e, bool* present) -> int64_t {
    *present = false;
    if (!e) return 0;
    Value v = eval(*e, frame);
    if (v.is_none()) return 0;
    if (!v.is_int() && !v.is_bool()) {
      bad_index = true;  // Python's TypeError, which jinja2's getitem turns into undefined
      return 0;
    }
    *present = true;
    return v.as_int();
  };
  bool has_start, has_stop, has_step;
  int64_t start = bound(s.start, &has_start);
  int64_t stop = bound(s.stop, &has_stop);
  int64_t step_n = bound(s.step, &has_step);
  if (!has_step) step_n = 1;
  if (obj.is_undefined()) fail_undefined(obj);
  if (bad_index) return Value::undefined(object_description(obj) + " has no element slice");
  if (step_n == 0) type_error("slice step cannot be zero");
  bool is_str = obj.is_string();
  if (!is_str && !is_sequence_list(obj)) return Value::undefined(object_description(obj) + " has no element slice");
  std::vector<size_t> offs;
  int64_t n;
  if (is_str) {
    offs = code_point_offsets(obj.as_string());
    n = int64_t(offs.size()) - 1;
  } else {
    n = int64_t(obj.items().size());
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](int64_t v, bool present, int64_t dflt) {
    if (!present) return dflt;
    if (v < 0) {
      v += n;
      if (v < 0) v = step_n < 0 ? -1 : 0;
    } else if (v >= n) {
      v = step_n < 0 ? n - 1 : n;
    }
    return v;
  };
  start = adjust(start, has_start, step_n < 0 ? n - 1 : 0);
  stop = adjust(stop, has_stop, step_n < 0 ? -1 : n);
  std::vector<int64_t> idx;
  if (step_n > 0) {
    for (int64_t i = start; i < stop; i += step_n) idx.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step_n) idx.push_back(i);
  }
  step(idx.size());
  if (is_str) {
    const std::string& str = obj.as_string();
    std::string out;
    for (int64_t i : idx) out.append(str, offs[size_t(i)], offs[size_t(i) + 1] - offs[size_t(i)]);
    return make_string(std::move(out));
  }
  std::vector<Value> out;
  out.reserve(idx.size());
  for (int64_t i : idx) out.push_back(obj.items()[size_t(i)]);
  return make_list(std::move(out), obj.list_kind());
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::List: return v.items();
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().items.size());
      for (const auto& kv : v.as_dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::String: {
      const std::string& s = v.as_string();
      std::vector<Value> chars;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t start = pos;
        next_code_point(s, &pos);
        chars.emplace_back(s.substr(start, pos - start));
      }
      step(chars.size());
      return chars;
    }
    case Value::Kind::Undefined: return {};
    default: type_error("'" + type_name(v) + "' object is not iterable");
  }
}

Value Interpreter::apply_filter(std::string_view name, const Value& v, CallArgs& args) {
  FilterFn fn = find_filter(name);
  if (!fn) type_error("No filter named '" + std::string(name) + "'.");
  return fn(*this, v, args);
}

bool Interpreter::apply_test(std::string_view name, const Value& v, CallArgs& args) {
  TestFn fn = find_test(name);
  if (!fn) type_error("No test named '" + std::string(name) + "'.");
  return fn(*this, v, args);
}

// ---------------------------------------------------------------------------
// Expressions
// ---------------------------------------------------------------------------

Value Interpreter::eval_name(const NameExpr& e, const FramePtr& frame) {
  if (const Value* v = frame->find(e.name)) return *v;
  return Value::undefined(quoted_repr(e.name) + " is undefined");
}

Value Interpreter::eval_getitem(const GetitemExpr& e, const FramePtr& frame) {
  Value obj = eval(*e.obj, frame);
  if (e.index->kind == ExprKind::Slice) return slice(obj, static_cast<const SliceExpr&>(*e.index), frame);
  return getitem(obj, eval(*e.index, frame));
}

Value Interpreter::eval_call(const CallExpr& e, const FramePtr& frame) {
  // obj.method(...) calls the method directly, without a bound-method object.
  if (e.callee->kind == ExprKind::Getattr) {
    const auto& ga = static_cast<const GetattrExpr&>(*e.callee);
    Value obj = eval(*ga.obj, frame);
    if (!obj.is_undefined() && !obj.is_dict() && !obj.is_namespace() && has_method(obj, ga.attr)) {
      CallArgs args = eval_args(e.args, frame);
      step();
      line_ = e.line;
      return call_method(*this, obj, ga.attr, args);
    }
    Value callee = getattr(obj, ga.attr);
    CallArgs args = eval_args(e.args, frame);
    line_ = e.line;
    return call(callee, args);
  }
  Value callee = eval(*e.callee, frame);
  CallArgs args = eval_args(e.args, frame);
  line_ = e.line;
  return call(callee, args);
}

Value Interpreter::eval_binary(BinOp op, const Value& a, const Value& b) {
  switch (op) {
    case BinOp::Add: return python_add(*this, a, b);
    case BinOp::Sub:
      if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return Value(a.as_double() - b.as_double());
        int64_t r;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) int_overflow();
        return Value(r);
      }
      unsupported_operands("-", a, b);
    case BinOp::Mul:
      if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return Value(a.as_double() * b.as_double());
        int64_t r;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) int_overflow();
        return Value(r);
      }
      if ((a.is_string() || is_sequence_list(a)) && (b.is_int() || b.is_bool())) return repeat(*this, a, b.as_int());
      if ((b.is_string() || is_sequence_list(b)) && (a.is_int() || a.is_bool())) return repeat(*this, b, a.as_int());
      unsupported_operands("*", a, b);
    case BinOp::Div:
      if (a.is_number() && b.is_number()) {
        if (b.as_double() == 0) raise(ErrorKind::Type, a.is_float() || b.is_float() ? "float division by zero" : "division by zero");
        return Value(a.as_double() / b.as_double());
      }
      unsupported_operands("/", a, b);
    case BinOp::FloorDiv:
      if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) {
          if (b.as_double() == 0) type_error("float floor division by zero");
          double x = a.as_double(), y = b.as_double();
          return Value((x - python_fmod(x, y)) / y);
        }
        int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) type_error("integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) int_overflow();
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value(q);
      }
      unsupported_operands("//", a, b);
    case BinOp::Mod:
      if (a.is_string()) return make_string(python_percent_format(*this, a.as_string(), b));
      if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) {
          if (b.as_double() == 0) type_error("float modulo");
          return Value(python_fmod(a.as_double(), b.as_double()));
        }
        int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) type_error("integer modulo by zero");
        if (y == -1) return Value(int64_t(0));
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value(m);
      }
      unsupported_operands("%", a, b);
    case BinOp::Pow:
      if (a.is_number() && b.is_number()) {
        if (!a.is_float() && !b.is_float() && b.as_int() >= 0) {
          int64_t base = a.as_int(), e = b.as_int(), r = 1;
          while (e > 0) {
            step();
            if (e & 1)
              if (__builtin_mul_overflow(r, base, &r)) int_overflow();
            e >>= 1;
            if (e && __builtin_mul_overflow(base, base, &base)) int_overflow();
          }
          return Value(r);
        }
        double x = a.as_double(), y = b.as_double();
        if (x == 0 && y < 0) type_error("0.0 cannot be raised to a negative power");
        if (x < 0 && y != std::floor(y)) type_error("negative number raised to a fractional power (complex result)");
        double r = std::pow(x, y);
        if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) type_error("(34, 'Numerical result out of range')");
        return Value(r);
      }
      unsupported_operands("** or pow()", a, b);
  }
  type_error("unsupported operator");
}

bool Interpreter::eval_compare(CmpOp op, const Value& a, const Value& b) {
  switch (op) {
    case CmpOp::Eq: return equals(a, b);
    case CmpOp::Ne: return !equals(a, b);
    case CmpOp::Lt: return less_than(a, b, "<");
    case CmpOp::Gt: return less_than(b, a, ">");
    case CmpOp::Le:
      if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return a.as_double() <= b.as_double();
        return a.as_int() <= b.as_int();
      }
      return !less_than(b, a, "<=");
    case CmpOp::Ge:
      if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return a.as_double() >= b.as_double();
        return a.as_int() >= b.as_int();
      }
      return !less_than(a, b, ">=");
    case CmpOp::In: return python_contains(b, a);
    case CmpOp::NotIn: return !python_contains(b, a);
  }
  return false;
}

Value Interpreter::eval(const Expr& e, const FramePtr& frame) {
  step();
  check_stack();
  switch (e.kind) {
    case ExprKind::Const: return static_cast<const ConstExpr&>(e).value;
    case ExprKind::Name: return eval_name(static_cast<const NameExpr&>(e), frame);
    case ExprKind::List:
    case ExprKind::Tuple: {
      const auto& s = static_cast<const SeqExpr&>(e);
      std::vector<Value> items;
      items.reserve(s.items.size());
      for (const auto& item : s.items) items.push_back(eval(*item, frame));
      return make_list(std::move(items), e.kind == ExprKind::Tuple ? ListKind::Tuple : ListKind::List);
    }
    case ExprKind::Dict: {
      DictData d;
      for (const auto& [k, v] : static_cast<const DictExpr&>(e).pairs) {
        Value key = eval(*k, frame);
        if ((key.is_list() && key.list_kind() != ListKind::Tuple) || key.is_dict() || key.is_namespace())
          type_error("unhashable type: '" + type_name(key) + "'");
        d.set(std::move(key), eval(*v, frame));
      }
      return make_dict(std::move(d));
    }
    case ExprKind::Getattr: {
      const auto& g = static_cast<const GetattrExpr&>(e);
      return getattr(eval(*g.obj, frame), g.attr);
    }
    case ExprKind::Getitem: return eval_getitem(static_cast<const GetitemExpr&>(e), frame);
    case ExprKind::Slice: type_error("a slice is only valid inside [ ]");
    case ExprKind::Call: return eval_call(static_cast<const CallExpr&>(e), frame);
    case ExprKind::Filter: {
      const auto& f = static_cast<const FilterExpr&>(e);
      if (!f.fn) type_error("No filter named '" + f.name + "'.");
      Value input = f.node ? eval(*f.node, frame) : Value();
      CallArgs args = eval_args(f.args, frame);
      line_ = f.line;
      return f.fn(*this, input, args);
    }
    case ExprKind::Test: {
      const auto& t = static_cast<const TestExpr&>(e);
      if (!t.fn) type_error("No test named '" + t.name + "'.");
      Value input = eval(*t.node, frame);
      CallArgs args = eval_args(t.args, frame);
      line_ = t.line;
      return Value(t.fn(*this, input, args));
    }
    case ExprKind::Not: return Value(!truthy(eval(*static_cast<const UnaryExpr&>(e).operand, frame)));
    case ExprKind::Neg:
    case ExprKind::Pos: {
      Value v = eval(*static_cast<const UnaryExpr&>(e).operand, frame);
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number())
        type_error(std::string("bad operand type for unary ") + (e.kind == ExprKind::Neg ? "-" : "+") + ": '" +
                   type_name(v) + "'");
      if (e.kind == ExprKind::Pos) return v.is_bool() ? Value(v.as_int()) : v;
      if (v.is_float()) return Value(-v.as_double());
      if (v.as_int() == std::numeric_limits<int64_t>::min()) int_overflow();
      return Value(-v.as_int());
    }
    case ExprKind::Binary: {
      const auto& b = static_cast<const BinaryExpr&>(e);
      Value l = eval(*b.left, frame);
      Value r = eval(*b.right, frame);
      line_ = e.line;
      return eval_binary(b.op, l, r);
    }
    case ExprKind::And: {
      const auto& b = static_cast<const BinaryExpr&>(e);
      Value l = eval(*b.left, frame);
      if (!truthy(l)) return l;
      return eval(*b.right, frame);
    }
    case ExprKind::Or: {
      const auto& b = static_cast<const BinaryExpr&>(e);
      Value l = eval(*b.left, frame);
      if (truthy(l)) return l;
      return eval(*b.right, frame);
    }
    case ExprKind::Concat: {
      std::string out;
      for (const auto& item : static_cast<const ConcatExpr&>(e).items) {
        append_str(out, eval(*item, frame));
        if (out.size() > limits_.max_output_bytes) raise(ErrorKind::Limit, "string longer than the output limit");
      }
      return make_string(std::move(out));
    }
    case ExprKind::Compare: {
      const auto& c = static_cast<const CompareExpr&>(e);
      Value a = eval(*c.first, frame);
      for (const auto& [op, expr] : c.ops) {
        Value b = eval(*expr, frame);
        line_ = e.line;
        if (!eval_compare(op, a, b)) return Value(false);
        a = std::move(b);
      }
      return Value(true);
    }
    case ExprKind::CondExpr: {
      const auto& c = static_cast<const CondExpr&>(e);
      if (truthy(eval(*c.test, frame))) return eval(*c.then, frame);
      if (c.otherwise) return eval(*c.otherwise, frame);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
    case ExprKind::NSRef: type_error("namespace reference outside an assignment");
  }
  type_error("unknown expression");
}

}  // namespace muse::jinja
