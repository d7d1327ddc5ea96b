// Jinja's built-in filters on sequences and mappings (jinja2.filters):
// first/last/list/join/map/select/sort/groupby/... Filters that return
// generators in jinja2 return lists here (the same once iterated, joined or
// passed through |list).
#include <algorithm>

#include "muse/jinja/builtins.h"
#include "muse/jinja/filters_internal.h"
#include "muse/jinja/interpreter.h"
#include "muse/jinja/unicode.h"

namespace muse::jinja {

using namespace filters;

namespace {

// jinja2's make_attrgetter: "a.b.0" looks up each part with getitem
// (integers as indices); a default replaces an undefined result.
struct AttrGetter {
  std::vector<Value> parts;
  bool lowercase = false;
  Value fallback;
  bool has_fallback = false;

  AttrGetter(const Value& attribute, bool ignore_case) : lowercase(ignore_case) {
    if (attribute.is_undefined() || attribute.is_none()) return;
    if (attribute.is_int()) {
      parts.push_back(attribute);
      return;
    }
    std::string s = to_str(attribute);
    size_t start = 0;
    while (true) {
      size_t dot = s.find('.', start);
      std::string part = s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      int64_t n;
      bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (numeric && python_int_from_string(part, &n)) parts.emplace_back(n);
      else parts.emplace_back(part);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  }

  Value get(Interpreter& in, const Value& item) const {
    Value v = item;
    for (const auto& p : parts) v = in.getitem(v, p);
    if (has_fallback && v.is_undefined()) v = fallback;
    if (lowercase && v.is_string()) v = Value(to_lower(v.as_string()));
    return v;
  }
};

Value lowered(const Value& v, bool ignore_case) {
  if (ignore_case && v.is_string()) return Value(to_lower(v.as_string()));
  return v;
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("batch", a, {"linecount", "fill_with"});
  int64_t n = int_arg(b[0], "linecount");
  if (n <= 0) type_error("batch size must be positive");
  std::vector<Value> out, cur;
  for (auto& item : in.iterate(v)) {
    cur.push_back(std::move(item));
    if (int64_t(cur.size()) == n) out.push_back(in.make_list(std::move(cur))), cur.clear();
  }
  if (!cur.empty()) {
    if (b.given(1) && !b[1].is_none()) {
      in.step(uint64_t(n) - cur.size());
      while (int64_t(cur.size()) < n) cur.push_back(b[1]);
    }
    out.push_back(in.make_list(std::move(cur)));
  }
  return in.make_list(std::move(out));
}

Value f_slice(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("slice", a, {"slices", "fill_with"});
  int64_t slices = int_arg(b[0], "slices");
  if (slices <= 0 || slices > 100000) type_error("slices must be a positive count");
  std::vector<Value> seq = in.iterate(v);
  int64_t length = int64_t(seq.size());
  int64_t per = length / slices, extra = length % slices, offset = 0;
  std::vector<Value> out;
  for (int64_t i = 0; i < slices; ++i) {
    int64_t start = offset + i * per;
    if (i < extra) ++offset;
    int64_t end = offset + (i + 1) * per;
    std::vector<Value> part(seq.begin() + start, seq.begin() + end);
    if (b.given(1) && !b[1].is_none() && i >= extra) part.push_back(b[1]);
    out.push_back(in.make_list(std::move(part)));
  }
  return in.make_list(std::move(out));
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("dictsort", a, {"case_sensitive", "by", "reverse"});
  bool ignore_case = !(b.given(0) && truthy(b[0]));
  std::string by = b.given(1) ? str_arg(b[1], "by") : "key";
  bool reverse = b.given(2) && truthy(b[2]);
  if (by != "key" && by != "value") type_error("You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) type_error("dictsort needs a mapping");
  std::vector<std::pair<Value, Value>> items = v.as_dict().items;
  size_t pos = by == "key" ? 0 : 1;
  auto key = [&](const std::pair<Value, Value>& kv) { return lowered(pos == 0 ? kv.first : kv.second, ignore_case); };
  in.step(items.size());
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    return reverse ? less_than(key(y), key(x)) : less_than(key(x), key(y));
  });
  std::vector<Value> out;
  for (auto& [k, val] : items) out.push_back(in.make_list({k, val}, ListKind::Tuple));
  return in.make_list(std::move(out));
}

Value f_first(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("first", a, {});
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("last", a, {});
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_list(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("list", a, {});
  return in.make_list(in.iterate(v));
}

Value f_items(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("items", a, {});
  if (v.is_undefined()) return in.make_list({});
  if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.as_dict().items) out.push_back(Value::list({k, val}, ListKind::Tuple));
  return in.make_list(std::move(out));
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("join", a, {"d", "attribute"});
  std::string sep = b.given(0) ? to_str(b[0]) : "";
  AttrGetter getter(b[1], false);
  std::string out;
  bool first = true;
  for (const auto& item : in.iterate(v)) {
    in.step();
    if (!first) out += sep;
    first = false;
    append_str(out, b.given(1) ? getter.get(in, item) : item);
    if (out.size() > in.limits().max_output_bytes) raise(ErrorKind::Limit, "join result longer than the output limit");
  }
  return in.make_string(std::move(out));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  std::vector<Value> items = in.iterate(v);
  if (a.args.empty()) {
    Value attribute, fallback;
    bool has_fallback = false;
    for (auto& [k, val] : a.kwargs) {
      if (k == "attribute") attribute = val;
      else if (k == "default") fallback = val, has_fallback = true;
      else type_error("Unexpected keyword argument '" + k + "'");
    }
    if (attribute.is_undefined()) type_error("map requires a filter name or an attribute");
    AttrGetter getter(attribute, false);
    getter.fallback = fallback;
    getter.has_fallback = has_fallback;
    for (const auto& item : items) {
      in.step();
      out.push_back(getter.get(in, item));
    }
    return in.make_list(std::move(out));
  }
  std::string name = str_arg(a.args[0], "filter name");
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (const auto& item : items) {
    in.step();
    CallArgs call = rest;
    out.push_back(in.apply_filter(name, item, call));
  }
  return in.make_list(std::move(out));
}

// select / reject / selectattr / rejectattr.
Value select_common(Interpreter& in, const Value& v, CallArgs& a, bool lookup_attr, bool keep_when) {
  size_t pos = 0;
  Value attribute;
  if (lookup_attr) {
    if (a.args.empty()) type_error("Missing parameter for attribute name");
    attribute = a.args[pos++];
  }
  std::string test;
  if (pos < a.args.size()) test = str_arg(a.args[pos++], "test name");
  CallArgs rest;
  rest.args.assign(a.args.begin() + long(pos), a.args.end());
  rest.kwargs = a.kwargs;
  AttrGetter getter(attribute, false);
  std::vector<Value> out;
  for (const auto& item : in.iterate(v)) {
    in.step();
    Value probe = lookup_attr ? getter.get(in, item) : item;
    bool ok;
    if (test.empty()) {
      ok = truthy(probe);
    } else {
      CallArgs call = rest;
      ok = in.apply_test(test, probe, call);
    }
    if (ok == keep_when) out.push_back(item);
  }
  return in.make_list(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_common(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_common(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_common(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_common(in, v, a, true, false); }

// Comma-separated attributes compare as a tuple (jinja2's make_multi_attrgetter).
std::vector<AttrGetter> multi_getter(const Value& attribute, bool ignore_case) {
  std::vector<AttrGetter> out;
  if (attribute.is_string()) {
    std::string s = attribute.as_string();
    size_t start = 0;
    while (true) {
      size_t comma = s.find(',', start);
      out.emplace_back(Value(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start)),
                       ignore_case);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else {
    out.emplace_back(attribute, ignore_case);
  }
  return out;
}

Value sort_key(Interpreter& in, const std::vector<AttrGetter>& getters, const Value& item, bool ignore_case) {
  if (getters.size() == 1 && getters[0].parts.empty()) return lowered(item, ignore_case);
  if (getters.size() == 1) return getters[0].get(in, item);
  std::vector<Value> parts;
  for (const auto& g : getters) parts.push_back(g.get(in, item));
  return Value::list(std::move(parts), ListKind::Tuple);
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("sort", a, {"reverse", "case_sensitive", "attribute"});
  bool reverse = b.given(0) && truthy(b[0]);
  bool ignore_case = !(b.given(1) && truthy(b[1]));
  auto getters = multi_getter(b[2], ignore_case);
  std::vector<Value> items = in.iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : items) keyed.emplace_back(sort_key(in, getters, item, ignore_case), item);
  in.step(keyed.size());
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? less_than(y.first, x.first) : less_than(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return in.make_list(std::move(out));
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("unique", a, {"case_sensitive", "attribute"});
  bool ignore_case = !(b.given(0) && truthy(b[0]));
  AttrGetter getter(b[1], ignore_case);
  std::vector<Value> seen, out;
  for (const auto& item : in.iterate(v)) {
    Value key = getter.parts.empty() ? lowered(item, ignore_case) : getter.get(in, item);
    bool dup = false;
    for (const auto& s : seen) {
      in.step();
      if (equals(s, key)) dup = true;
      if (dup) break;
    }
    if (!dup) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return in.make_list(std::move(out));
}

Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool want_max, const char* name) {
  ArgBinder b(name, a, {"case_sensitive", "attribute"});
  bool ignore_case = !(b.given(0) && truthy(b[0]));
  AttrGetter getter(b[1], ignore_case);
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& item) { return getter.parts.empty() ? lowered(item, ignore_case) : getter.get(in, item); };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (want_max ? less_than(best_key, k) : less_than(k, best_key)) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true, "max"); }
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false, "min"); }

Value f_reverse(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("reverse", a, {});
  if (v.is_string()) {
    std::vector<Value> chars = in.iterate(v);
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->as_string();
    return in.make_string(std::move(out));
  }
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return in.make_list(std::move(items));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("sum", a, {"attribute", "start"});
  AttrGetter getter(b[0], false);
  Value total = b.given(1) ? b[1] : Value(int64_t(0));
  for (const auto& item : in.iterate(v)) {
    in.step();
    total = python_add(in, total, getter.parts.empty() ? item : getter.get(in, item));
  }
  return total;
}

Value f_groupby(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("groupby", a, {"attribute", "default", "case_sensitive"});
  bool ignore_case = !(b.given(2) && truthy(b[2]));
  AttrGetter getter(b[0], ignore_case);
  if (b.given(1)) {
    getter.fallback = b[1];
    getter.has_fallback = true;
  }
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : in.iterate(v)) keyed.emplace_back(getter.get(in, item), item);
  in.step(keyed.size());
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& x, const auto& y) { return less_than(x.first, y.first); });
  std::vector<Value> groups;
  size_t i = 0;
  while (i < keyed.size()) {
    std::vector<Value> members;
    size_t j = i;
    while (j < keyed.size() && equals(keyed[j].first, keyed[i].first)) members.push_back(keyed[j++].second);
    // jinja2 reports the grouper from the original (not lowercased) first item.
    Value grouper = keyed[i].first;
    if (ignore_case) {
      AttrGetter exact(b[0], false);
      grouper = exact.get(in, members.front());
      if (b.given(1) && grouper.is_undefined()) grouper = b[1];
    }
    groups.push_back(in.make_list({grouper, in.make_list(std::move(members))}, ListKind::Tuple));
    i = j;
  }
  return in.make_list(std::move(groups));
}

}  // namespace

void add_sequence_filters(std::unordered_map<std::string_view, FilterFn>& t) {
  t.insert({
      {"batch", f_batch}, {"dictsort", f_dictsort}, {"first", f_first}, {"groupby", f_groupby}, {"items", f_items},
      {"join", f_join}, {"last", f_last}, {"list", f_list}, {"map", f_map}, {"max", f_max}, {"min", f_min},
      {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"reverse", f_reverse}, {"select", f_select},
      {"selectattr", f_selectattr}, {"slice", f_slice}, {"sort", f_sort}, {"sum", f_sum}, {"unique", f_unique},
  });
}

}  // namespace muse::jinja
