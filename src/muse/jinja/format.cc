// Python text formatting: json.dumps (transformers' tojson), printf-style
// `fmt % args`, and str.format.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "muse/jinja/builtins.h"
#include "muse/jinja/interpreter.h"
#include "muse/jinja/unicode.h"

namespace muse::jinja {

// ---------------------------------------------------------------------------
// json.dumps
// ---------------------------------------------------------------------------

namespace {

[[noreturn]] void not_serializable(const Value& v) {
  type_error("Object of type " + type_name(v) + " is not JSON serializable");
}

void json_float(std::string& out, double d) {
  if (std::isnan(d)) out += "NaN";
  else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
  else format_python_float(out, d);
}

// json.dumps converts non-string keys: True -> "true", 1.5 -> "1.5", None -> "null".
std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::String: return k.as_string();
    case Value::Kind::Bool: return k.as_bool() ? "true" : "false";
    case Value::Kind::None: return "null";
    case Value::Kind::Int: return std::to_string(k.as_int());
    case Value::Kind::Float: {
      std::string s;
      json_float(s, k.as_double());
      return s;
    }
    default: type_error("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

void newline_indent(std::string& out, const JsonDumpStyle& s, int level) {
  out.push_back('\n');
  for (int i = 0; i < level; ++i) out += s.indent;
}

}  // namespace

void dump_json(std::string& out, const Value& v, const JsonDumpStyle& style, int level) {
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: json_float(out, v.as_double()); return;
    case Value::Kind::String: json_escape_to(out, v.as_string(), style.ensure_ascii); return;
    case Value::Kind::List: {
      if (v.list_kind() != ListKind::List && v.list_kind() != ListKind::Tuple) not_serializable(v);
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += style.item_separator;
        if (style.has_indent) newline_indent(out, style, level + 1);
        dump_json(out, items[i], style, level + 1);
      }
      if (style.has_indent) newline_indent(out, style, level);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      const auto& items = v.as_dict().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      struct Member {
        std::string name;
        const Value* key;
        const Value* value;
      };
      std::vector<Member> members;
      members.reserve(items.size());
      for (const auto& [k, val] : items) members.push_back(Member{json_key(k), &k, &val});
      // Python sorts the original keys (before converting them to strings):
      // numbers numerically, and mixed key types are a TypeError.
      if (style.sort_keys)
        std::stable_sort(members.begin(), members.end(),
                         [](const Member& a, const Member& b) { return less_than(*a.key, *b.key); });
      out.push_back('{');
      for (size_t i = 0; i < members.size(); ++i) {
        if (i) out += style.item_separator;
        if (style.has_indent) newline_indent(out, style, level + 1);
        json_escape_to(out, members[i].name, style.ensure_ascii);
        out += style.key_separator;
        dump_json(out, *members[i].value, style, level + 1);
      }
      if (style.has_indent) newline_indent(out, style, level);
      out.push_back('}');
      return;
    }
    default: not_serializable(v);
  }
}

// ---------------------------------------------------------------------------
// printf-style formatting
// ---------------------------------------------------------------------------

namespace {

struct Spec {
  bool left = false, plus = false, space = false, zero = false, alt = false;
  int width = -1, precision = -1;
  char conv = 's';
};

std::string pad(std::string body, const Spec& sp, bool numeric) {
  size_t len = code_point_count(body);
  if (sp.width < 0 || len >= size_t(sp.width)) return body;
  size_t fill = size_t(sp.width) - len;
  if (sp.left) return body + std::string(fill, ' ');
  if (sp.zero && numeric) {
    size_t sign = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
    if (body.size() > sign + 1 && body[sign] == '0' && (body[sign + 1] | 32) == 'x') sign += 2;
    return body.substr(0, sign) + std::string(fill, '0') + body.substr(sign);
  }
  return std::string(fill, ' ') + body;
}

std::string format_number(const Value& v, const Spec& sp) {
  char conv = sp.conv;
  if (!v.is_number()) {
    if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o' || conv == 'c')
      type_error(std::string("%") + conv + " format: a real number is required, not " + type_name(v));
    type_error("must be real number, not " + type_name(v));
  }
  std::string sign;
  std::string body;
  if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
    double d = v.as_double();
    if (v.is_float() && !std::isfinite(d)) type_error("cannot convert float infinity to integer");
    int64_t n = v.is_float() ? int64_t(std::trunc(d)) : v.as_int();
    bool neg = n < 0;
    uint64_t mag = neg ? uint64_t(0) - uint64_t(n) : uint64_t(n);
    char buf[80];
    if (conv == 'd' || conv == 'i') std::snprintf(buf, sizeof buf, "%llu", (unsigned long long)mag);
    else if (conv == 'o') std::snprintf(buf, sizeof buf, sp.alt ? "0o%llo" : "%llo", (unsigned long long)mag);
    else if (conv == 'x') std::snprintf(buf, sizeof buf, sp.alt ? "0x%llx" : "%llx", (unsigned long long)mag);
    else std::snprintf(buf, sizeof buf, sp.alt ? "0X%llX" : "%llX", (unsigned long long)mag);
    body = buf;
    if (sp.precision > 0 && body.size() < size_t(sp.precision)) body.insert(0, size_t(sp.precision) - body.size(), '0');
    sign = neg ? "-" : sp.plus ? "+" : sp.space ? " " : "";
  } else {
    double d = v.as_double();
    int prec = sp.precision < 0 ? 6 : std::min(sp.precision, 200);
    char fmt[16];
    std::snprintf(fmt, sizeof fmt, "%%%s.%d%c", sp.alt ? "#" : "", prec, conv);
    char buf[512];
    std::snprintf(buf, sizeof buf, fmt, std::fabs(d));
    body = buf;
    sign = std::signbit(d) && !std::isnan(d) ? "-" : sp.plus ? "+" : sp.space ? " " : "";
  }
  return pad(sign + body, sp, true);
}

}  // namespace

std::string python_percent_format(Interpreter& in, const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  const DictData* mapping = nullptr;
  if (args.is_list() && args.list_kind() == ListKind::Tuple) positional = args.items();
  else if (args.is_dict()) mapping = &args.as_dict();
  else positional.push_back(args);
  if (args.is_undefined()) {
    const UndefinedInfo* info = args.undefined_info();
    raise(ErrorKind::Undefined, info ? info->message : "value is undefined");
  }
  size_t next_arg = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c != '%') {
      out.push_back(c);
      continue;
    }
    if (++i >= fmt.size()) type_error("incomplete format");
    Spec sp;
    const Value* arg = nullptr;
    Value key_value;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) type_error("incomplete format key");
      if (!mapping) type_error("format requires a mapping");
      const Value* v = mapping->find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (!v) type_error("KeyError: " + repr(Value(fmt.substr(i + 1, close - i - 1))));
      key_value = *v;
      arg = &key_value;
      used_mapping = true;
      i = close + 1;
    }
    for (; i < fmt.size(); ++i) {
      char f = fmt[i];
      if (f == '-') sp.left = true;
      else if (f == '+') sp.plus = true;
      else if (f == ' ') sp.space = true;
      else if (f == '0') sp.zero = true;
      else if (f == '#') sp.alt = true;
      else break;
    }
    auto read_int = [&](int* outv) {
      if (i < fmt.size() && fmt[i] == '*') {
        if (next_arg >= positional.size() || !positional[next_arg].is_int()) type_error("* wants int");
        *outv = int(std::clamp<int64_t>(positional[next_arg++].as_int(), -100000, 100000));
        ++i;
        return;
      }
      int v = 0;
      bool any = false;
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
        v = std::min(v * 10 + (fmt[i] - '0'), 100000);
        ++i;
        any = true;
      }
      if (any) *outv = v;
    };
    read_int(&sp.width);
    if (sp.width < 0 && sp.width != -1) {
      sp.left = true;
      sp.width = -sp.width;
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      sp.precision = 0;
      read_int(&sp.precision);
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) type_error("incomplete format");
    sp.conv = fmt[i];
    if (sp.conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!arg) {
      if (mapping) {
        key_value = args;
        arg = &key_value;
      } else {
        if (next_arg >= positional.size()) type_error("not enough arguments for format string");
        arg = &positional[next_arg++];
      }
    }
    std::string piece;
    switch (sp.conv) {
      case 's': piece = to_str(*arg); break;
      case 'r':
      case 'a': piece = repr(*arg); break;
      case 'c':
        if (arg->is_string() && code_point_count(arg->as_string()) == 1) piece = arg->as_string();
        else if (arg->is_int() && arg->as_int() >= 0 && arg->as_int() <= 0x10FFFF)
          append_utf8(piece, arg->as_int() >= 0xD800 && arg->as_int() <= 0xDFFF ? 0xFFFD : uint32_t(arg->as_int()));
        else type_error("%c requires int or char");
        break;
      case 'd': case 'i': case 'o': case 'x': case 'X': case 'e': case 'E': case 'f': case 'F': case 'g': case 'G':
        out += format_number(*arg, sp);
        continue;
      default: type_error(std::string("unsupported format character '") + sp.conv + "'");
    }
    if (sp.precision >= 0) {
      auto offs = code_point_offsets(piece);
      if (size_t(sp.precision) + 1 < offs.size()) piece.resize(offs[size_t(sp.precision)]);
    }
    out += pad(std::move(piece), sp, false);
    if (out.size() > in.limits().max_output_bytes) raise(ErrorKind::Limit, "formatted string longer than the output limit");
  }
  if (!mapping && !used_mapping && next_arg < positional.size())
    type_error("not all arguments converted during string formatting");
  return out;
}

}  // namespace muse::jinja

// ---------------------------------------------------------------------------
// str.format (the common subset of Python's format mini-language)
// ---------------------------------------------------------------------------

namespace muse::jinja {

namespace {

std::string apply_format_spec(const Value& v, const std::string& spec) {
  size_t i = 0;
  std::string fill = " ";
  char align = 0, sign = '-', type = 0;
  bool alt = false, zero = false, comma = false;
  int width = -1, precision = -1;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (spec.size() >= 2 && is_align(spec[1])) {
    fill = spec.substr(0, 1);
    align = spec[1];
    i = 2;
  } else if (!spec.empty() && is_align(spec[0])) {
    align = spec[0];
    i = 1;
  }
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
  if (i < spec.size() && spec[i] == '#') alt = true, ++i;
  if (i < spec.size() && spec[i] == '0') zero = true, ++i;
  auto read_num = [&](int* out) {
    int n = 0;
    bool any = false;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) {
      n = std::min(n * 10 + (spec[i++] - '0'), 100000);
      any = true;
    }
    if (any) *out = n;
  };
  read_num(&width);
  if (i < spec.size() && spec[i] == ',') comma = true, ++i;
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    precision = 0;
    read_num(&precision);
  }
  if (i < spec.size()) type = spec[i++];
  if (i != spec.size()) type_error("Invalid format specifier '" + spec + "'");
  std::string body;
  bool numeric = false;
  if (type == 0 && !v.is_number()) type = 's';
  if (type == 's') {
    if (!v.is_string()) type_error("Unknown format code 's' for object of type '" + type_name(v) + "'");
    body = v.as_string();
    if (precision >= 0) {
      auto offs = code_point_offsets(body);
      if (size_t(precision) + 1 < offs.size()) body.resize(offs[size_t(precision)]);
    }
  } else {
    if (!v.is_number()) type_error(std::string("Unknown format code '") + type + "' for object of type '" + type_name(v) + "'");
    numeric = true;
    double d = v.as_double();
    bool neg = std::signbit(d) && !std::isnan(d);
    char buf[512];
    if (type == 0 && !v.is_float()) type = 'd';
    if (type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b') {
      if (v.is_float()) type_error(std::string("Unknown format code '") + type + "' for object of type 'float'");
      int64_t n = v.as_int();
      neg = n < 0;
      uint64_t mag = neg ? uint64_t(0) - uint64_t(n) : uint64_t(n);
      if (type == 'b') {
        std::string bits;
        do { bits.insert(bits.begin(), char('0' + (mag & 1))); mag >>= 1; } while (mag);
        body = (alt ? "0b" : "") + bits;
      } else {
        const char* f = type == 'd' ? "%llu" : type == 'o' ? "%llo" : type == 'x' ? "%llx" : "%llX";
        std::snprintf(buf, sizeof buf, f, (unsigned long long)mag);
        body = buf;
        if (alt && type != 'd') body = std::string(type == 'o' ? "0o" : type == 'x' ? "0x" : "0X") + body;
      }
      if (comma && type == 'd') {
        std::string grouped;
        for (size_t k = 0; k < body.size(); ++k) {
          if (k && (body.size() - k) % 3 == 0) grouped.push_back(',');
          grouped.push_back(body[k]);
        }
        body = grouped;
      }
    } else if (type == 0) {
      std::string r;
      format_python_float(r, std::fabs(d));
      if (precision >= 0) {
        std::snprintf(buf, sizeof buf, "%.*g", std::min(precision == 0 ? 1 : precision, 200), std::fabs(d));
        r = buf;
      }
      body = r;
    } else if (std::string_view("eEfFgG%").find(type) != std::string_view::npos) {
      int p = precision < 0 ? 6 : std::min(precision, 200);
      double x = std::fabs(d);
      char t = type;
      if (t == '%') {
        x *= 100;
        t = 'f';
      }
      char fmt2[16];
      std::snprintf(fmt2, sizeof fmt2, alt ? "%%#.%d%c" : "%%.%d%c", p, t);
      std::snprintf(buf, sizeof buf, fmt2, x);
      body = buf;
      if (type == '%') body += "%";
    } else {
      type_error(std::string("Unknown format code '") + type + "'");
    }
    std::string sign_text = neg ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
    body = sign_text + body;
    if (zero && !align) {
      align = '=';
      fill = "0";
    }
  }
  size_t len = code_point_count(body);
  if (width < 0 || len >= size_t(width)) return body;
  size_t pad_n = size_t(width) - len;
  if (!align) align = numeric ? '>' : '<';
  auto repeat_fill = [&](size_t n) {
    std::string s;
    for (size_t k = 0; k < n; ++k) s += fill;
    return s;
  };
  switch (align) {
    case '<': return body + repeat_fill(pad_n);
    case '>': return repeat_fill(pad_n) + body;
    case '^': return repeat_fill(pad_n / 2) + body + repeat_fill(pad_n - pad_n / 2);
    default: {  // '=': padding after the sign
      size_t s = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
      return body.substr(0, s) + repeat_fill(pad_n) + body.substr(s);
    }
  }
}

}  // namespace

std::string python_str_format(Interpreter& in, const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      type_error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) type_error("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string spec, conv;
    size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field.resize(bang);
    }
    size_t name_end = field.find_first_of(".[");
    std::string head = field.substr(0, name_end);
    Value v;
    if (head.empty()) {
      if (used_manual) type_error("cannot switch from manual field specification to automatic field numbering");
      used_auto = true;
      if (auto_index >= args.args.size()) type_error("Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
      v = args.args[auto_index++];
    } else if (std::all_of(head.begin(), head.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      if (used_auto) type_error("cannot switch from automatic field numbering to manual field specification");
      used_manual = true;
      size_t idx = head.size() > 6 ? SIZE_MAX : size_t(std::stoul(head));
      if (idx >= args.args.size()) type_error("Replacement index " + head + " out of range for positional args tuple");
      v = args.args[idx];
    } else {
      bool found = false;
      for (auto& [k, val] : args.kwargs)
        if (k == head) v = val, found = true;
      if (!found) type_error("KeyError: '" + head + "'");
    }
    // .attr and [key] accessors.
    size_t p = name_end;
    while (p != std::string::npos && p < field.size()) {
      if (field[p] == '.') {
        size_t e = field.find_first_of(".[", p + 1);
        v = in.getattr(v, field.substr(p + 1, e == std::string::npos ? std::string::npos : e - p - 1));
        p = e;
      } else {
        size_t e = field.find(']', p);
        if (e == std::string::npos) type_error("Missing ']' in format string");
        std::string key = field.substr(p + 1, e - p - 1);
        int64_t n;
        v = python_int_from_string(key, &n) ? in.getitem(v, Value(n)) : in.getitem(v, Value(key));
        p = e + 1;
      }
    }
    if (conv == "r" || conv == "a") v = Value(repr(v));
    else if (conv == "s") v = Value(to_str(v));
    else if (!conv.empty()) type_error("Unknown conversion specifier " + conv);
    if (spec.empty()) append_str(out, v);
    else out += apply_format_spec(v.is_undefined() ? Value(to_str(v)) : v, spec);
    if (out.size() > in.limits().max_output_bytes) raise(ErrorKind::Limit, "formatted string longer than the output limit");
  }
  return out;
}

}  // namespace muse::jinja
