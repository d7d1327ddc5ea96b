// Jinja's built-in filters on strings and scalars (jinja2.filters), plus
// transformers' tojson. Sequence filters are in filters_seq.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>

#include "muse/jinja/builtins.h"
#include "muse/jinja/filters_internal.h"
#include "muse/jinja/interpreter.h"
#include "muse/jinja/unicode.h"

namespace muse::jinja {

ArgBinder::ArgBinder(std::string_view fn, CallArgs& args, std::initializer_list<std::string_view> params)
    : values_(params.size()), given_(params.size(), false) {
  std::vector<std::string_view> names(params);
  if (args.args.size() > names.size())
    type_error(std::string(fn) + "() takes at most " + std::to_string(names.size() + 1) + " arguments (" +
               std::to_string(args.args.size() + 1) + " given)");
  for (size_t i = 0; i < args.args.size(); ++i) {
    values_[i] = args.args[i];
    given_[i] = true;
  }
  for (auto& [k, v] : args.kwargs) {
    size_t idx = names.size();
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == k) idx = i;
    if (idx == names.size()) type_error(std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
    if (given_[idx]) type_error(std::string(fn) + "() got multiple values for argument '" + k + "'");
    values_[idx] = v;
    given_[idx] = true;
  }
}

namespace filters {

void fail_if_undefined(const Value& v) {
  if (!v.is_undefined()) return;
  const UndefinedInfo* info = v.undefined_info();
  raise(info && info->security ? ErrorKind::Security : ErrorKind::Undefined,
        info ? info->message : "value is undefined");
}

std::string str_arg(const Value& v, std::string_view what) {
  if (v.is_string()) return v.as_string();
  fail_if_undefined(v);
  type_error(std::string(what) + " must be str, not " + type_name(v));
}

int64_t int_arg(const Value& v, std::string_view what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  fail_if_undefined(v);
  type_error("'" + type_name(v) + "' object cannot be interpreted as an integer (" + std::string(what) + ")");
}

std::vector<std::string> splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> lines;
  size_t start = 0, pos = 0;
  while (pos < s.size()) {
    size_t at = pos;
    uint32_t c = next_code_point(s, &pos);
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t end = pos;
    if (c == '\r' && pos < s.size() && s[pos] == '\n') end = ++pos;
    lines.push_back(s.substr(start, (keepends ? end : at) - start));
    start = pos;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string python_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (count < 0) count = INT64_MAX;
  if (old.empty()) {
    // Python inserts `repl` before every character and at the end.
    size_t pos = 0;
    int64_t n = 0;
    while (pos <= s.size()) {
      if (n < count) {
        out += repl;
        ++n;
      }
      if (pos == s.size()) break;
      size_t start = pos;
      next_code_point(s, &pos);
      out.append(s, start, pos - start);
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (n < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += repl;
    pos = hit + old.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// Python float(str): decimal literals, inf/nan, surrounding whitespace.
bool parse_python_float(const std::string& text, double* out) {
  std::string_view t = strip_view(text, nullptr, true, true);
  std::string clean;
  for (size_t i = 0; i < t.size(); ++i) {
    char c = t[i];
    if (c == '_') {
      if (i == 0 || i + 1 >= t.size() || !std::isdigit(static_cast<unsigned char>(t[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(t[i + 1])))
        return false;
      continue;
    }
    clean.push_back(c);
  }
  if (clean.empty()) return false;
  std::string lower = to_lower(clean);
  std::string_view body = lower;
  bool neg = false;
  if (body[0] == '+' || body[0] == '-') {
    neg = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity") {
    *out = neg ? -INFINITY : INFINITY;
    return true;
  }
  if (body == "nan") {
    *out = NAN;
    return true;
  }
  for (char c : body)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-')) return false;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return end && *end == 0;
}

}  // namespace filters

using namespace filters;

namespace {

Value f_abs(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("abs", a, {});
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) type_error("integer overflow in abs()");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  fail_if_undefined(v);
  type_error("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("attr", a, {"name"});
  std::string name = str_arg(b[0], "attribute name");
  if (v.is_dict()) {
    if (has_method(v, name)) return bound_method(v, name);
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  return in.getattr(v, name);
}

Value f_capitalize(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("capitalize", a, {});
  return in.make_string(to_capitalize(to_str(v)));
}

Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("center", a, {"width"});
  int64_t width = b.given(0) ? int_arg(b[0], "width") : 80;
  std::string s = to_str(v);
  int64_t len = int64_t(code_point_count(s));
  if (width <= len) return Value(s);
  if (width > int64_t(in.limits().max_output_bytes)) raise(ErrorKind::Limit, "center width beyond the output limit");
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  return in.make_string(std::string(size_t(left), ' ') + s + std::string(size_t(marg - left), ' '));
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("default", a, {"default_value", "boolean"});
  Value fallback = b.given(0) ? b[0] : Value("");
  bool boolean = b.given(1) && truthy(b[1]);
  if (v.is_undefined() || (boolean && !truthy(v))) return fallback;
  return v;
}

Value f_escape(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("escape", a, {});
  return in.make_string(html_escape(to_str(v)));
}

Value f_filesizeformat(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("filesizeformat", a, {"binary"});
  bool binary = b.given(0) && truthy(b[0]);
  if (!v.is_number()) {
    fail_if_undefined(v);
    type_error("filesizeformat needs a number");
  }
  double bytes = v.as_double();
  double base = binary ? 1024 : 1000;
  static const char* dec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  static const char* bin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  char buf[64];
  if (bytes == 1) return Value("1 Byte");
  if (bytes < base) {
    std::snprintf(buf, sizeof buf, "%d Bytes", int(bytes));
    return in.make_string(buf);
  }
  for (int i = 0; i < 8; ++i) {
    double unit = std::pow(base, i + 2);
    if (bytes < unit || i == 7) {
      std::snprintf(buf, sizeof buf, "%.1f %s", base * bytes / unit, binary ? bin[i] : dec[i]);
      return in.make_string(buf);
    }
  }
  return Value("");
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("float", a, {"default"});
  Value fallback = b.given(0) ? b[0] : Value(0.0);
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    double d;
    if (parse_python_float(v.as_string(), &d)) return Value(d);
  }
  return fallback;
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  std::string fmt = to_str(v);
  if (!a.args.empty() && !a.kwargs.empty())
    type_error("can't handle positional and keyword arguments at the same time");
  if (!a.kwargs.empty()) {
    DictData d;
    for (auto& [k, val] : a.kwargs) d.set(Value(k), val);
    return in.make_string(python_percent_format(in, fmt, Value::dict(std::move(d))));
  }
  return in.make_string(python_percent_format(in, fmt, Value::list(a.args, ListKind::Tuple)));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("indent", a, {"width", "first", "blank"});
  std::string indention;
  if (b.given(0) && b[0].is_string()) {
    indention = b[0].as_string();
  } else {
    int64_t w = b.given(0) ? int_arg(b[0], "width") : 4;
    if (w > 4096) raise(ErrorKind::Limit, "indent width too large");
    indention = std::string(size_t(std::max<int64_t>(w, 0)), ' ');
  }
  bool first = b.given(1) && truthy(b[1]);
  bool blank = b.given(2) && truthy(b[2]);
  std::string s = to_str(v) + "\n";  // jinja2's quirk, needed for splitlines
  std::vector<std::string> lines = splitlines(s, false);
  in.charge(s.size() + lines.size() * indention.size());
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        if (!lines[i].empty()) rv += indention;
        rv += lines[i];
      }
    }
  }
  if (first) rv = indention + rv;
  return in.make_string(std::move(rv));
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("int", a, {"default", "base"});
  Value fallback = b.given(0) ? b[0] : Value(int64_t(0));
  int64_t base = b.given(1) ? int_arg(b[1], "base") : 10;
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
    return Value(int64_t(std::trunc(d)));
  }
  if (v.is_string()) {
    int64_t n;
    if (base >= 0 && base <= 36 && base != 1 && python_int_from_string(v.as_string(), &n, int(base))) return Value(n);
    double d;
    if (parse_python_float(v.as_string(), &d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
      return Value(int64_t(std::trunc(d)));
  }
  return fallback;
}

Value f_length(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("length", a, {});
  switch (v.kind()) {
    case Value::Kind::String: return Value(int64_t(code_point_count(v.as_string())));
    case Value::Kind::List: return Value(int64_t(v.items().size()));
    case Value::Kind::Dict: return Value(int64_t(v.as_dict().items.size()));
    case Value::Kind::Undefined: return Value(int64_t(0));
    case Value::Kind::Loop: return Value(v.as_loop().length);
    default: type_error("object of type '" + type_name(v) + "' has no len()");
  }
}

Value f_lower(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("lower", a, {});
  return in.make_string(to_lower(to_str(v)));
}

Value f_upper(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("upper", a, {});
  return in.make_string(to_upper(to_str(v)));
}

Value f_title(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("title", a, {});
  return in.make_string(to_title(to_str(v)));
}

Value f_pprint(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("pprint", a, {});
  return in.make_string(repr(v));
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("replace", a, {"old", "new", "count"});
  if (!b.given(0) || !b.given(1)) type_error("replace() missing required arguments 'old' and 'new'");
  std::string old = to_str(b[0]), repl = to_str(b[1]);
  int64_t count = b.given(2) && !b[2].is_none() ? int_arg(b[2], "count") : -1;
  std::string s = to_str(v);
  if (!old.empty() && repl.size() > old.size()) {
    // Bound the result before building it.
    size_t hits = 0, pos = 0;
    while ((pos = s.find(old, pos)) != std::string::npos) {
      ++hits;
      pos += old.size();
    }
    if (s.size() + hits * (repl.size() - old.size()) > in.limits().max_output_bytes)
      raise(ErrorKind::Limit, "replace result longer than the output limit");
  } else if (old.empty() && (s.size() + 1) * (repl.size() + 4) > in.limits().max_output_bytes) {
    raise(ErrorKind::Limit, "replace result longer than the output limit");
  }
  return in.make_string(python_replace(s, old, repl, count));
}

Value f_round(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("round", a, {"precision", "method"});
  int64_t precision = b.given(0) ? int_arg(b[0], "precision") : 0;
  std::string method = b.given(1) ? str_arg(b[1], "method") : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    type_error("method must be common, ceil or floor");
  if (!v.is_number()) {
    fail_if_undefined(v);
    type_error("type " + type_name(v) + " doesn't define __round__ method");
  }
  if (method == "common" && !v.is_float()) return Value(v.as_int());  // int.__round__ keeps ints
  double x = v.as_double();
  if (!std::isfinite(x)) return Value(x);
  precision = std::clamp<int64_t>(precision, -300, 300);
  if (method != "common") {
    double p = std::pow(10.0, double(precision));
    return Value((method == "ceil" ? std::ceil(x * p) : std::floor(x * p)) / p);
  }
  // Python's round(x, n): correctly rounded, ties to even on the exact binary
  // value, which is what printf's %.Nf does.
  if (precision >= 0) {
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", int(std::min<int64_t>(precision, 330)), x);
    return Value(std::strtod(buf, nullptr));
  }
  double p = std::pow(10.0, double(-precision));
  double r = std::nearbyint(x / p) * p;
  (void)in;
  return Value(r);
}

Value f_string(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("string", a, {});
  if (v.is_string()) return v;
  return in.make_string(to_str(v));
}

Value f_safe(Interpreter& in, const Value& v, CallArgs& a) { return f_string(in, v, a); }

Value f_striptags(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("striptags", a, {});
  std::string s = to_str(v), out;
  // Drop comments and tags, then collapse whitespace (entities are left alone).
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 4, "<!--") == 0) {
      size_t e = s.find("-->", i + 4);
      if (e == std::string::npos) { out.append(s, i, std::string::npos); break; }
      i = e + 3;
    } else if (s[i] == '<') {
      size_t e = s.find('>', i + 1);
      if (e == std::string::npos) { out.append(s, i, std::string::npos); break; }
      i = e + 1;
    } else {
      out.push_back(s[i++]);
    }
  }
  std::string collapsed;
  size_t pos = 0;
  bool pending_space = false;
  while (pos < out.size()) {
    size_t start = pos;
    uint32_t c = next_code_point(out, &pos);
    if (is_space(c)) {
      pending_space = !collapsed.empty();
      continue;
    }
    if (pending_space) collapsed.push_back(' ');
    pending_space = false;
    collapsed.append(out, start, pos - start);
  }
  return in.make_string(std::move(collapsed));
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpStyle style;
  style.ensure_ascii = b.given(0) && truthy(b[0]);
  style.sort_keys = b.given(3) && truthy(b[3]);
  if (b.given(1) && !b[1].is_none()) {
    style.has_indent = true;
    if (b[1].is_string()) {
      style.indent = b[1].as_string();
    } else {
      int64_t n = int_arg(b[1], "indent");
      style.indent = std::string(size_t(std::clamp<int64_t>(n, 0, 1024)), ' ');
    }
    style.item_separator = ",";
  }
  if (b.given(2) && !b[2].is_none()) {
    if (!b[2].is_list() || b[2].items().size() != 2 || !b[2].items()[0].is_string() || !b[2].items()[1].is_string())
      type_error("separators must be a pair of strings");
    style.item_separator = b[2].items()[0].as_string();
    style.key_separator = b[2].items()[1].as_string();
  }
  std::string out;
  dump_json(out, v, style);
  return in.make_string(std::move(out));
}

Value f_trim(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("trim", a, {"chars"});
  std::string s = to_str(v);
  std::string chars;
  if (b.given(0) && !b[0].is_none()) chars = str_arg(b[0], "chars");
  return in.make_string(std::string(strip_view(s, b.given(0) && !b[0].is_none() ? &chars : nullptr, true, true)));
}

Value f_truncate(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("truncate", a, {"length", "killwords", "end", "leeway"});
  int64_t length = b.given(0) ? int_arg(b[0], "length") : 255;
  bool killwords = b.given(1) && truthy(b[1]);
  std::string end = b.given(2) ? to_str(b[2]) : "...";
  int64_t leeway = b.given(3) && !b[3].is_none() ? int_arg(b[3], "leeway") : 5;
  std::string s = to_str(v);
  auto offs = code_point_offsets(s);
  int64_t n = int64_t(offs.size()) - 1;
  int64_t end_len = int64_t(code_point_count(end));
  if (length < end_len) type_error("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (leeway < 0) type_error("expected leeway >= 0, got " + std::to_string(leeway));
  if ((__int128)n <= (__int128)length + leeway) return Value(s);
  std::string head = s.substr(0, offs[size_t(length - end_len)]);
  if (killwords) return in.make_string(head + end);
  size_t sp = head.rfind(' ');
  std::string result = sp == std::string::npos ? "" : head.substr(0, sp);
  return in.make_string(result + end);
}

Value f_urlencode(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("urlencode", a, {});
  auto quote = [](const std::string& s, bool for_qs) {
    std::string out;
    for (unsigned char c : s) {
      if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || (!for_qs && c == '/')) {
        out.push_back(char(c));
      } else {
        char buf[4];
        std::snprintf(buf, sizeof buf, "%%%02X", c);
        out += buf;
      }
    }
    return out;
  };
  if (v.is_dict()) {
    std::string out;
    for (const auto& [k, val] : v.as_dict().items) {
      if (!out.empty()) out += "&";
      out += quote(to_str(k), true) + "=" + quote(to_str(val), true);
    }
    return in.make_string(std::move(out));
  }
  return in.make_string(quote(to_str(v), false));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("wordcount", a, {});
  std::string s = to_str(v);
  int64_t words = 0;
  bool in_word = false;
  size_t pos = 0;
  while (pos < s.size()) {
    uint32_t c = next_code_point(s, &pos);
    bool w = is_alpha(c) || is_digit(c) || c == '_';
    if (w && !in_word) ++words;
    in_word = w;
  }
  return Value(words);
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  static const std::unordered_map<std::string_view, FilterFn> table = [] {
    std::unordered_map<std::string_view, FilterFn> t = {
        {"abs", f_abs}, {"attr", f_attr}, {"capitalize", f_capitalize}, {"center", f_center},
        {"count", f_length}, {"d", f_default}, {"default", f_default}, {"e", f_escape}, {"escape", f_escape},
        {"filesizeformat", f_filesizeformat}, {"float", f_float}, {"forceescape", f_escape}, {"format", f_format},
        {"indent", f_indent}, {"int", f_int}, {"length", f_length}, {"lower", f_lower}, {"pprint", f_pprint},
        {"replace", f_replace}, {"round", f_round}, {"safe", f_safe}, {"string", f_string},
        {"striptags", f_striptags}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim},
        {"truncate", f_truncate}, {"upper", f_upper}, {"urlencode", f_urlencode}, {"wordcount", f_wordcount},
    };
    add_sequence_filters(t);
    return t;
  }();
  auto it = table.find(name);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace muse::jinja
