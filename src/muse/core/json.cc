#include "muse/core/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>

namespace muse {

// ---------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t min;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) { len = 2; min = 0x80; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; min = 0x800; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; min = 0x10000; cp = c & 0x07; }
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// ---------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------

namespace {

class Parser {
 public:
  Parser(std::string_view text, const JsonParseOptions& options) : s_(text), opt_(options) {}

  Result<Json> run() {
    skip_ws();
    Json value;
    if (!parse_value(value, 0)) return fail_error();
    skip_ws();
    if (pos_ != s_.size()) {
      set_error("unexpected data after the JSON value");
      return fail_error();
    }
    return value;
  }

 private:
  std::string_view s_;
  const JsonParseOptions& opt_;
  size_t pos_ = 0;
  std::string err_;
  size_t err_pos_ = 0;

  bool set_error(const std::string& what) {
    if (err_.empty()) {
      err_ = what;
      err_pos_ = pos_;
    }
    return false;
  }

  Error fail_error() const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < err_pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') { ++line; col = 1; } else { ++col; }
    }
    return make_error("invalid JSON at line " + std::to_string(line) + ", column " + std::to_string(col) +
                      " (byte " + std::to_string(err_pos_) + "): " + err_);
  }

  void skip_ws() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') ++pos_; else break;
    }
  }

  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return set_error("invalid literal");
    pos_ += word.size();
    return true;
  }

  bool parse_value(Json& out, int depth) {
    if (pos_ >= s_.size()) return set_error("unexpected end of input, expected a value");
    char c = s_[pos_];
    switch (c) {
      case '{': return parse_object(out, depth + 1);
      case '[': return parse_array(out, depth + 1);
      case '"': {
        std::string str;
        if (!parse_string(str)) return false;
        out = Json(std::move(str));
        return true;
      }
      case 't': if (!literal("true")) return false; out = Json(true); return true;
      case 'f': if (!literal("false")) return false; out = Json(false); return true;
      case 'n': if (!literal("null")) return false; out = Json(nullptr); return true;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(out);
        return set_error(std::string("unexpected character '") + (c >= 0x20 && c < 0x7f ? std::string(1, c) : "\\x" + hex2(uint8_t(c))) + "'");
    }
  }

  static std::string hex2(uint8_t v) {
    const char* d = "0123456789abcdef";
    return std::string{d[v >> 4], d[v & 15]};
  }

  bool parse_number(Json& out) {
    size_t start = pos_;
    bool is_float = false;
    if (s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size()) return set_error("invalid number");
    if (s_[pos_] == '0') {
      ++pos_;
    } else if (s_[pos_] >= '1' && s_[pos_] <= '9') {
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    } else {
      return set_error("invalid number");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      is_float = true;
      ++pos_;
      size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == d) return set_error("invalid number: digits expected after '.'");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      is_float = true;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == d) return set_error("invalid number: digits expected in exponent");
    }
    const char* b = s_.data() + start;
    const char* e = s_.data() + pos_;
    if (!is_float) {
      int64_t v = 0;
      auto r = std::from_chars(b, e, v);
      if (r.ec == std::errc() && r.ptr == e) {
        out = Json(v);
        return true;
      }
      // Out of int64 range: keep it as a double, as Python would lose nothing
      // we could represent anyway.
    }
    double d = 0;
    auto r = std::from_chars(b, e, d);
    if (r.ec == std::errc::result_out_of_range) {
      // Overflow to +-inf is not representable in JSON output; reject.
      bool tiny = false;
      for (const char* p = b; p < e; ++p) if (*p == 'e' || *p == 'E') { tiny = p + 1 < e && p[1] == '-'; break; }
      if (!tiny) return set_error("number out of range");
      d = 0.0;
    } else if (r.ec != std::errc() || r.ptr != e) {
      return set_error("invalid number");
    }
    out = Json(d);
    return true;
  }

  bool parse_hex4(uint32_t& v) {
    if (pos_ + 4 > s_.size()) return set_error("truncated \\u escape");
    v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= uint32_t(c - 'A' + 10);
      else return set_error("invalid hex digit in \\u escape");
    }
    return true;
  }

  bool parse_string(std::string& out) {
    ++pos_;  // opening quote
    while (true) {
      // Fast path: copy a run of plain bytes.
      size_t run = pos_;
      while (run < s_.size()) {
        unsigned char c = static_cast<unsigned char>(s_[run]);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++run;
      }
      out.append(s_.data() + pos_, run - pos_);
      pos_ = run;
      if (pos_ >= s_.size()) return set_error("unterminated string");
      unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') { ++pos_; return true; }
      if (c < 0x20) return set_error("control character in string (must be escaped)");
      if (c >= 0x80) {
        // Validate one UTF-8 sequence.
        size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || pos_ + len > s_.size() ||
            find_invalid_utf8(s_.substr(pos_, len)) != std::string_view::npos)
          return set_error("invalid UTF-8 in string");
        out.append(s_.data() + pos_, len);
        pos_ += len;
        continue;
      }
      // Escape.
      ++pos_;
      if (pos_ >= s_.size()) return set_error("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (!parse_hex4(cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo;
            if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u')
              return set_error("unpaired UTF-16 surrogate in \\u escape");
            pos_ += 2;
            if (!parse_hex4(lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF) return set_error("unpaired UTF-16 surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return set_error("unpaired UTF-16 surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default: --pos_; return set_error("invalid escape character");
      }
    }
  }

  bool parse_array(Json& out, int depth) {
    if (depth > opt_.max_depth) return set_error("nesting deeper than " + std::to_string(opt_.max_depth));
    ++pos_;
    JsonArray arr;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; out = Json(std::move(arr)); return true; }
    while (true) {
      skip_ws();
      Json v;
      if (!parse_value(v, depth)) return false;
      arr.push_back(std::move(v));
      skip_ws();
      if (pos_ >= s_.size()) return set_error("unterminated array");
      if (s_[pos_] == ',') { ++pos_; continue; }
      if (s_[pos_] == ']') { ++pos_; break; }
      return set_error("expected ',' or ']' in array");
    }
    out = Json(std::move(arr));
    return true;
  }

  bool parse_object(Json& out, int depth) {
    if (depth > opt_.max_depth) return set_error("nesting deeper than " + std::to_string(opt_.max_depth));
    ++pos_;
    JsonObject obj;
    std::unordered_map<std::string, size_t> index;  // only for large objects
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; out = Json(std::move(obj)); return true; }
    while (true) {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') return set_error("expected a string key in object");
      std::string key;
      if (!parse_string(key)) return false;
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != ':') return set_error("expected ':' after object key");
      ++pos_;
      skip_ws();
      Json v;
      if (!parse_value(v, depth)) return false;
      // Duplicate detection: linear for small objects, hashed for large ones.
      size_t dup = SIZE_MAX;
      if (obj.size() < 16) {
        for (size_t i = 0; i < obj.size(); ++i) if (obj[i].first == key) { dup = i; break; }
      } else {
        if (index.empty()) for (size_t i = 0; i < obj.size(); ++i) index.emplace(obj[i].first, i);
        auto it = index.find(key);
        if (it != index.end()) dup = it->second;
      }
      if (dup != SIZE_MAX) {
        if (opt_.reject_duplicate_keys) return set_error("duplicate key \"" + key + "\"");
        obj[dup].second = std::move(v);
      } else {
        if (!index.empty()) index.emplace(key, obj.size());
        obj.emplace_back(std::move(key), std::move(v));
      }
      skip_ws();
      if (pos_ >= s_.size()) return set_error("unterminated object");
      if (s_[pos_] == ',') { ++pos_; continue; }
      if (s_[pos_] == '}') { ++pos_; break; }
      return set_error("expected ',' or '}' in object");
    }
    out = Json(std::move(obj));
    return true;
  }
};

}  // namespace

Result<Json> Json::parse(std::string_view text, const JsonParseOptions& options) {
  return Parser(text, options).run();
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

void json_escape_to(std::string& out, std::string_view s, bool ensure_ascii) {
  static const char* hex = "0123456789abcdef";
  out.push_back('"');
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    if (c < 0x20 || c == 0x7f) {
      if (c == 0x7f && !ensure_ascii) { out.push_back(char(c)); ++i; continue; }
      out += "\\u00";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
      ++i;
      continue;
    }
    if (c < 0x80 || !ensure_ascii) {
      out.push_back(char(c));
      ++i;
      continue;
    }
    // Decode one UTF-8 sequence and write \uXXXX (surrogate pairs above BMP).
    uint32_t cp = 0xFFFD;
    size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (len > 1 && i + len <= n && find_invalid_utf8(s.substr(i, len)) == std::string_view::npos) {
      cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    } else {
      len = 1;
    }
    auto put = [&](uint32_t u) {
      out += "\\u";
      for (int sh = 12; sh >= 0; sh -= 4) out.push_back(hex[(u >> sh) & 15]);
    };
    if (cp >= 0x10000) {
      cp -= 0x10000;
      put(0xD800 + (cp >> 10));
      put(0xDC00 + (cp & 0x3FF));
    } else {
      put(cp);
    }
    i += len;
  }
  out.push_back('"');
}

std::string json_quote(std::string_view s, bool ensure_ascii) {
  std::string out;
  json_escape_to(out, s, ensure_ascii);
  return out;
}

void format_python_float(std::string& out, double d) {
  if (std::isnan(d)) { out += "NaN"; return; }
  if (std::isinf(d)) { out += d < 0 ? "-Infinity" : "Infinity"; return; }
  if (d == 0) { out += std::signbit(d) ? "-0.0" : "0.0"; return; }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, size_t(r.ptr - buf));  // e.g. "-1.2345e+17"
  bool neg = sci[0] == '-';
  if (neg) sci.remove_prefix(1);
  size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos)) if (c != '.') digits.push_back(c);
  int exp = std::atoi(std::string(sci.substr(epos + 1)).c_str());
  if (neg) out.push_back('-');
  if (exp >= -5 + 1 && exp < 16) {  // Python repr: fixed when -4 <= exp < 16
    if (exp < 0) {
      out += "0.";
      out.append(size_t(-exp - 1), '0');
      out += digits;
    } else {
      size_t int_digits = size_t(exp) + 1;
      if (digits.size() <= int_digits) {
        out += digits;
        out.append(int_digits - digits.size(), '0');
        out += ".0";
      } else {
        out.append(digits, 0, int_digits);
        out.push_back('.');
        out.append(digits, int_digits, std::string::npos);
      }
    }
  } else {
    out.push_back(digits[0]);
    if (digits.size() > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    out.push_back('e');
    out.push_back(exp < 0 ? '-' : '+');
    int a = exp < 0 ? -exp : exp;
    if (a < 10) out.push_back('0');
    out += std::to_string(a);
  }
}

namespace {

void newline_indent(std::string& out, const JsonDumpOptions& o, int level) {
  if (o.indent < 0) return;
  out.push_back('\n');
  out.append(size_t(o.indent) * size_t(level), ' ');
}

void dump_value(const Json& v, std::string& out, const JsonDumpOptions& o, int level) {
  switch (v.type()) {
    case Json::Type::Null: out += "null"; return;
    case Json::Type::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Json::Type::Int: out += std::to_string(v.as_int()); return;
    case Json::Type::Double: format_python_float(out, v.as_double()); return;
    case Json::Type::String: json_escape_to(out, v.as_string(), o.ensure_ascii); return;
    case Json::Type::Array: {
      const auto& a = v.as_array();
      out.push_back('[');
      if (a.empty()) { out.push_back(']'); return; }
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += o.item_separator;
        newline_indent(out, o, level + 1);
        dump_value(a[i], out, o, level + 1);
      }
      newline_indent(out, o, level);
      out.push_back(']');
      return;
    }
    case Json::Type::Object: {
      const auto& obj = v.as_object();
      out.push_back('{');
      if (obj.empty()) { out.push_back('}'); return; }
      std::vector<const JsonMember*> members;
      members.reserve(obj.size());
      for (const auto& m : obj) members.push_back(&m);
      if (o.sort_keys)
        std::stable_sort(members.begin(), members.end(),
                         [](const JsonMember* a, const JsonMember* b) { return a->first < b->first; });
      for (size_t i = 0; i < members.size(); ++i) {
        if (i) out += o.item_separator;
        newline_indent(out, o, level + 1);
        json_escape_to(out, members[i]->first, o.ensure_ascii);
        out += o.key_separator;
        dump_value(members[i]->second, out, o, level + 1);
      }
      newline_indent(out, o, level);
      out.push_back('}');
      return;
    }
  }
}

}  // namespace

void Json::dump_to(std::string& out, const JsonDumpOptions& options) const { dump_value(*this, out, options, 0); }

std::string Json::dump(const JsonDumpOptions& options) const {
  std::string out;
  dump_to(out, options);
  return out;
}

// ---------------------------------------------------------------------------
// Access helpers
// ---------------------------------------------------------------------------

const Json* Json::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& m : as_object())
    if (m.first == key) return &m.second;
  return nullptr;
}

Json* Json::find(std::string_view key) {
  if (!is_object()) return nullptr;
  for (auto& m : as_object())
    if (m.first == key) return &m.second;
  return nullptr;
}

Json& Json::operator[](std::string_view key) {
  if (is_null()) v_ = JsonObject{};
  if (Json* f = find(key)) return *f;
  auto& obj = as_object();
  obj.emplace_back(std::string(key), Json());
  return obj.back().second;
}

Json& Json::set(std::string_view key, Json value) {
  (*this)[key] = std::move(value);
  return *this;
}

bool Json::erase(std::string_view key) {
  if (!is_object()) return false;
  auto& obj = as_object();
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (it->first == key) {
      obj.erase(it);
      return true;
    }
  }
  return false;
}

void Json::push_back(Json value) {
  if (is_null()) v_ = JsonArray{};
  as_array().push_back(std::move(value));
}

size_t Json::size() const {
  if (is_array()) return as_array().size();
  if (is_object()) return as_object().size();
  return 0;
}

int64_t Json::get_int(std::string_view key, int64_t fallback) const {
  const Json* v = find(key);
  if (!v) return fallback;
  if (v->is_int()) return v->as_int();
  if (v->is_double() && std::floor(v->as_double()) == v->as_double() && std::fabs(v->as_double()) < 9e18)
    return int64_t(v->as_double());
  return fallback;
}

double Json::get_double(std::string_view key, double fallback) const {
  const Json* v = find(key);
  return v && v->is_number() ? v->as_double() : fallback;
}

bool Json::get_bool(std::string_view key, bool fallback) const {
  const Json* v = find(key);
  return v && v->is_bool() ? v->as_bool() : fallback;
}

std::string Json::get_string(std::string_view key, std::string_view fallback) const {
  const Json* v = find(key);
  return v && v->is_string() ? v->as_string() : std::string(fallback);
}

static Error wrong_type(std::string_view key, const char* want, const Json& got) {
  return make_error("\"" + std::string(key) + "\" must be " + want + ", got " + got.type_name());
}

Result<int64_t> Json::int_member(std::string_view key, int64_t fallback) const {
  const Json* v = find(key);
  if (!v || v->is_null()) return fallback;
  if (v->is_int()) return v->as_int();
  if (v->is_double() && std::floor(v->as_double()) == v->as_double() && std::fabs(v->as_double()) < 9e18)
    return int64_t(v->as_double());
  return wrong_type(key, "an integer", *v);
}

Result<double> Json::number_member(std::string_view key, double fallback) const {
  const Json* v = find(key);
  if (!v || v->is_null()) return fallback;
  if (v->is_number()) return v->as_double();
  return wrong_type(key, "a number", *v);
}

Result<bool> Json::bool_member(std::string_view key, bool fallback) const {
  const Json* v = find(key);
  if (!v || v->is_null()) return fallback;
  if (v->is_bool()) return v->as_bool();
  return wrong_type(key, "a boolean", *v);
}

Result<std::string> Json::string_member(std::string_view key, std::string_view fallback) const {
  const Json* v = find(key);
  if (!v || v->is_null()) return std::string(fallback);
  if (v->is_string()) return v->as_string();
  return wrong_type(key, "a string", *v);
}

bool Json::operator==(const Json& other) const {
  if (is_number() && other.is_number()) {
    if (is_int() && other.is_int()) return as_int() == other.as_int();
    return as_double() == other.as_double();
  }
  return v_ == other.v_;
}

const char* Json::type_name(Type t) {
  switch (t) {
    case Type::Null: return "null";
    case Type::Bool: return "a boolean";
    case Type::Int: return "an integer";
    case Type::Double: return "a number";
    case Type::String: return "a string";
    case Type::Array: return "an array";
    case Type::Object: return "an object";
  }
  return "?";
}

}  // namespace muse
