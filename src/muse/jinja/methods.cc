// Python methods reachable from templates: str (strip, split, startswith,
// ...), dict (get, items, keys, values), list/tuple (index, count) and the
// loop object's cycle()/changed(). Mutating methods are refused, as in
// jinja2's ImmutableSandboxedEnvironment.
#include <algorithm>
#include <unordered_set>

#include "muse/jinja/builtins.h"
#include "muse/jinja/filters_internal.h"
#include "muse/jinja/interpreter.h"
#include "muse/jinja/unicode.h"

namespace muse::jinja {

std::string python_str_format(Interpreter& in, const std::string& fmt, CallArgs& args);

using namespace filters;

namespace {

const std::unordered_set<std::string_view>& str_methods() {
  static const std::unordered_set<std::string_view> s = {
      "capitalize", "casefold", "center", "count", "endswith", "find", "format", "index", "isalnum", "isalpha",
      "isascii", "isdecimal", "isdigit", "islower", "isnumeric", "isspace", "istitle", "isupper", "join", "ljust",
      "lower", "lstrip", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust",
      "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "upper",
      "zfill"};
  return s;
}

bool is_seq(const Value& v) {
  return v.is_list() && (v.list_kind() == ListKind::List || v.list_kind() == ListKind::Tuple);
}

struct BoundMethod : Callable {
  BoundMethod(Value s, std::string n) : self(std::move(s)), name(std::move(n)) {}
  Value call(Interpreter& in, CallArgs& args) override { return call_method(in, self, name, args); }
  std::string repr() const override {
    return "<built-in method " + name + " of " + jinja::type_name(self) + " object>";
  }
  std::string_view type_name() const override { return "builtin_function_or_method"; }
  Value self;
  std::string name;
};

size_t cp_index(const std::string& s, size_t byte_pos) { return code_point_count(std::string_view(s).substr(0, byte_pos)); }

// Python's optional start/end arguments of find/count/startswith, in code points.
void bounds(const std::string& s, const ArgBinder& b, size_t first, size_t* lo, size_t* hi) {
  auto offs = code_point_offsets(s);
  int64_t n = int64_t(offs.size()) - 1;
  auto adjust = [&](size_t i, int64_t dflt) {
    if (!b.given(i) || b[i].is_none()) return dflt;
    int64_t v = int_arg(b[i], "index");
    if (v < 0) v = std::max<int64_t>(v + n, 0);
    return std::min(v, n);
  };
  int64_t start = adjust(first, 0), end = adjust(first + 1, n);
  *lo = offs[size_t(start)];
  *hi = std::max(offs[size_t(std::max(start, end))], *lo);
}

Value split(Interpreter& in, const std::string& s, CallArgs& a, bool from_right) {
  ArgBinder b(from_right ? "rsplit" : "split", a, {"sep", "maxsplit"});
  int64_t maxsplit = b.given(1) ? int_arg(b[1], "maxsplit") : -1;
  std::vector<Value> parts;
  if (!b.given(0) || b[0].is_none()) {
    // Runs of whitespace separate; leading/trailing whitespace is dropped.
    std::vector<std::pair<size_t, size_t>> words;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t start = pos;
      if (is_space(next_code_point(s, &pos))) continue;
      size_t end = pos;
      while (end < s.size()) {
        size_t p = end;
        if (is_space(next_code_point(s, &p))) break;
        end = p;
      }
      words.emplace_back(start, end);
      pos = end;
    }
    if (maxsplit < 0 || size_t(maxsplit) >= words.size()) {
      for (auto [x, y] : words) parts.emplace_back(s.substr(x, y - x));
    } else if (!from_right) {
      for (int64_t i = 0; i < maxsplit; ++i) parts.emplace_back(s.substr(words[size_t(i)].first, words[size_t(i)].second - words[size_t(i)].first));
      parts.emplace_back(s.substr(words[size_t(maxsplit)].first));  // the rest keeps its trailing spaces
    } else {
      size_t keep = words.size() - size_t(maxsplit);
      parts.emplace_back(s.substr(0, words[keep - 1].second));  // the head keeps its leading spaces
      for (size_t i = keep; i < words.size(); ++i) parts.emplace_back(s.substr(words[i].first, words[i].second - words[i].first));
    }
    in.step(parts.size());
    return in.make_list(std::move(parts));
  }
  std::string sep = str_arg(b[0], "separator");
  if (sep.empty()) type_error("empty separator");
  std::vector<size_t> hits;
  for (size_t p = s.find(sep); p != std::string::npos; p = s.find(sep, p + sep.size())) hits.push_back(p);
  if (maxsplit >= 0 && size_t(maxsplit) < hits.size()) {
    if (from_right) hits.erase(hits.begin(), hits.end() - maxsplit);
    else hits.resize(size_t(maxsplit));
  }
  size_t start = 0;
  for (size_t h : hits) {
    parts.emplace_back(s.substr(start, h - start));
    start = h + sep.size();
  }
  parts.emplace_back(s.substr(start));
  in.step(parts.size());
  return in.make_list(std::move(parts));
}

bool affix_match(const std::string& s, const Value& affix, size_t lo, size_t hi, bool prefix) {
  auto one = [&](const Value& v) {
    std::string p = str_arg(v, prefix ? "startswith first arg" : "endswith first arg");
    if (hi - lo < p.size()) return false;
    return prefix ? s.compare(lo, p.size(), p) == 0 : s.compare(hi - p.size(), p.size(), p) == 0;
  };
  if (affix.is_list() && affix.list_kind() == ListKind::Tuple) {
    for (const auto& v : affix.items())
      if (one(v)) return true;
    return false;
  }
  return one(affix);
}

Value justify(Interpreter& in, const std::string& s, CallArgs& a, const char* name, int mode) {
  ArgBinder b(name, a, {"width", "fillchar"});
  int64_t width = int_arg(b[0], "width");
  std::string fill = b.given(1) ? str_arg(b[1], "fillchar") : " ";
  if (code_point_count(fill) != 1) type_error("The fill character must be exactly one character long");
  int64_t len = int64_t(code_point_count(s));
  if (width <= len) return Value(s);
  if (width > int64_t(in.limits().max_output_bytes)) raise(ErrorKind::Limit, "width beyond the output limit");
  int64_t marg = width - len;
  int64_t left = mode == 0 ? marg / 2 + (marg & width & 1) : mode < 0 ? 0 : marg;
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return in.make_string(std::move(out));
}

template <class Pred>
bool all_chars(const std::string& s, Pred pred) {
  if (s.empty()) return false;
  size_t pos = 0;
  while (pos < s.size())
    if (!pred(next_code_point(s, &pos))) return false;
  return true;
}

Value call_str_method(Interpreter& in, const std::string& s, std::string_view name, CallArgs& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ArgBinder b(name, a, {"chars"});
    std::string chars;
    bool custom = b.given(0) && !b[0].is_none();
    if (custom) chars = str_arg(b[0], "chars");
    return Value(std::string(strip_view(s, custom ? &chars : nullptr, name != "rstrip", name != "lstrip")));
  }
  if (name == "split") return split(in, s, a, false);
  if (name == "rsplit") return split(in, s, a, true);
  if (name == "startswith" || name == "endswith") {
    ArgBinder b(name, a, {"affix", "start", "end"});
    size_t lo, hi;
    bounds(s, b, 1, &lo, &hi);
    return Value(affix_match(s, b[0], lo, hi, name == "startswith"));
  }
  if (name == "upper") return in.make_string(to_upper(s));
  if (name == "lower" || name == "casefold") return in.make_string(to_lower(s));
  if (name == "title") return in.make_string(to_title(s));
  if (name == "capitalize") return in.make_string(to_capitalize(s));
  if (name == "swapcase") return in.make_string(swap_case(s));
  if (name == "replace") {
    ArgBinder b(name, a, {"old", "new", "count"});
    std::string old = str_arg(b[0], "replace() argument 1"), repl = str_arg(b[1], "replace() argument 2");
    int64_t count = b.given(2) ? int_arg(b[2], "count") : -1;
    CallArgs fa;
    fa.args = {Value(old), Value(repl)};
    if (count >= 0) fa.args.push_back(Value(count));
    return in.apply_filter("replace", Value(s), fa);
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    ArgBinder b(name, a, {"sub", "start", "end"});
    std::string sub = str_arg(b[0], "substring");
    size_t lo, hi;
    bounds(s, b, 1, &lo, &hi);
    std::string_view hay = std::string_view(s).substr(lo, hi - lo);
    if (name == "count") {
      if (sub.empty()) return Value(int64_t(code_point_count(hay)) + 1);
      int64_t n = 0;
      for (size_t p = hay.find(sub); p != std::string::npos; p = hay.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    size_t p = name[0] == 'r' ? hay.rfind(sub) : hay.find(sub);
    if (p == std::string::npos) {
      if (name == "index" || name == "rindex") type_error("substring not found");
      return Value(int64_t(-1));
    }
    return Value(int64_t(cp_index(s, lo + p)));
  }
  if (name == "join") {
    ArgBinder b(name, a, {"iterable"});
    std::string out;
    size_t i = 0;
    for (const auto& item : in.iterate(b[0])) {
      in.step();
      if (!item.is_string())
        type_error("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(item) + " found");
      if (i++) out += s;
      out += item.as_string();
      if (out.size() > in.limits().max_output_bytes) raise(ErrorKind::Limit, "join result longer than the output limit");
    }
    return in.make_string(std::move(out));
  }
  if (name == "center") return justify(in, s, a, "center", 0);
  if (name == "ljust") return justify(in, s, a, "ljust", -1);
  if (name == "rjust") return justify(in, s, a, "rjust", 1);
  if (name == "zfill") {
    ArgBinder b(name, a, {"width"});
    int64_t width = int_arg(b[0], "width");
    int64_t len = int64_t(code_point_count(s));
    if (width <= len) return Value(s);
    if (width > int64_t(in.limits().max_output_bytes)) raise(ErrorKind::Limit, "width beyond the output limit");
    size_t sign = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
    return in.make_string(s.substr(0, sign) + std::string(size_t(width - len), '0') + s.substr(sign));
  }
  if (name == "partition" || name == "rpartition") {
    ArgBinder b(name, a, {"sep"});
    std::string sep = str_arg(b[0], "separator");
    if (sep.empty()) type_error("empty separator");
    size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (p == std::string::npos) {
      if (name == "partition") return in.make_list({Value(s), Value(""), Value("")}, ListKind::Tuple);
      return in.make_list({Value(""), Value(""), Value(s)}, ListKind::Tuple);
    }
    return in.make_list({Value(s.substr(0, p)), Value(sep), Value(s.substr(p + sep.size()))}, ListKind::Tuple);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    ArgBinder b(name, a, {"affix"});
    std::string x = str_arg(b[0], "affix");
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value(s.substr(x.size()));
    if (name == "removesuffix" && !x.empty() && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value(s.substr(0, s.size() - x.size()));
    return Value(s);
  }
  if (name == "splitlines") {
    ArgBinder b(name, a, {"keepends"});
    std::vector<Value> out;
    for (auto& line : splitlines(s, b.given(0) && truthy(b[0]))) out.emplace_back(std::move(line));
    return in.make_list(std::move(out));
  }
  if (name == "format") return in.make_string(python_str_format(in, s, a));
  ArgBinder b(name, a, {});
  if (name == "isalpha") return Value(all_chars(s, is_alpha));
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") return Value(all_chars(s, is_digit));
  if (name == "isalnum") return Value(all_chars(s, [](uint32_t c) { return is_alpha(c) || is_digit(c); }));
  if (name == "isspace") return Value(all_chars(s, is_space));
  if (name == "isascii") return Value(is_ascii(s));
  if (name == "islower" || name == "isupper") {
    bool want_lower = name == "islower", any = false;
    size_t pos = 0;
    while (pos < s.size()) {
      uint32_t c = next_code_point(s, &pos);
      if (want_lower ? is_upper_cp(c) : is_lower_cp(c)) return Value(false);
      any = any || is_upper_cp(c) || is_lower_cp(c);
    }
    return Value(any);
  }
  if (name == "istitle") return Value(!s.empty() && to_title(s) == s && (to_lower(s) != s || to_upper(s) != s));
  type_error("'str' object has no attribute '" + std::string(name) + "'");
}

Value call_loop_method(Interpreter& in, const Value& self, std::string_view name, CallArgs& a) {
  LoopData& loop = self.as_loop();
  if (name == "cycle") {
    if (a.args.empty()) type_error("no items for cycling given");
    return a.args[size_t(loop.index0 % int64_t(a.args.size()))];
  }
  // changed(*values): true when the values differ from the previous call's.
  Value current = in.make_list(a.args, ListKind::Tuple);
  if (loop.has_changed_value && equals(loop.changed_value, current)) return Value(false);
  loop.has_changed_value = true;
  loop.changed_value = current;
  return Value(true);
}

}  // namespace

bool has_method(const Value& self, std::string_view name) {
  switch (self.kind()) {
    case Value::Kind::String: return str_methods().count(name) > 0;
    case Value::Kind::Dict: return name == "get" || name == "items" || name == "keys" || name == "values" || name == "copy";
    case Value::Kind::List:
      if (!is_seq(self)) return false;
      return name == "index" || name == "count" || (name == "copy" && self.list_kind() == ListKind::List);
    case Value::Kind::Loop: return name == "cycle" || name == "changed";
    default: return false;
  }
}

bool is_unsafe_method(const Value& self, std::string_view name) {
  static const std::unordered_set<std::string_view> list_mut = {"append", "clear", "extend", "insert",
                                                                 "pop",    "remove", "reverse", "sort"};
  static const std::unordered_set<std::string_view> dict_mut = {"clear", "pop", "popitem", "setdefault", "update"};
  if (self.is_list() && self.list_kind() == ListKind::List) return list_mut.count(name) > 0;
  if (self.is_dict()) return dict_mut.count(name) > 0;
  return false;
}

Value bound_method(const Value& self, std::string_view name) {
  return Value(std::shared_ptr<Callable>(std::make_shared<BoundMethod>(self, std::string(name))));
}

Value call_method(Interpreter& in, const Value& self, std::string_view name, CallArgs& a) {
  switch (self.kind()) {
    case Value::Kind::String: return call_str_method(in, self.as_string(), name, a);
    case Value::Kind::Dict: {
      const DictData& d = self.as_dict();
      if (name == "get") {
        ArgBinder b("get", a, {"key", "default"});
        if (!b.given(0)) type_error("get expected at least 1 argument, got 0");
        if (const Value* v = d.find(b[0])) return *v;
        return b.given(1) ? b[1] : Value::none();
      }
      ArgBinder b(name, a, {});
      if (name == "copy") return self;
      std::vector<Value> out;
      out.reserve(d.items.size());
      for (const auto& [k, v] : d.items) {
        if (name == "keys") out.push_back(k);
        else if (name == "values") out.push_back(v);
        else out.push_back(Value::list({k, v}, ListKind::Tuple));
      }
      ListKind kind = name == "keys" ? ListKind::DictKeys : name == "values" ? ListKind::DictValues : ListKind::DictItems;
      return in.make_list(std::move(out), kind);
    }
    case Value::Kind::List: {
      if (name == "copy") return self;
      ArgBinder b(name, a, {"value"});
      const auto& items = self.items();
      if (name == "count") {
        int64_t n = 0;
        for (const auto& v : items) n += equals(v, b[0]) ? 1 : 0;
        return Value(n);
      }
      for (size_t i = 0; i < items.size(); ++i)
        if (equals(items[i], b[0])) return Value(int64_t(i));
      type_error(repr(b[0]) + " is not in list");
    }
    case Value::Kind::Loop: return call_loop_method(in, self, name, a);
    default: break;
  }
  type_error("'" + type_name(self) + "' object has no attribute '" + std::string(name) + "'");
}

}  // namespace muse::jinja
