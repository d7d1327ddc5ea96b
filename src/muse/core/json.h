// A small JSON DOM with insertion-ordered objects.
//
// Why our own: chat templates render tool schemas with `tojson`, and Hugging
// Face output keeps the key order of the request, so objects must preserve
// insertion order; the server must reject invalid UTF-8 and report byte
// positions; and every parser of ours is fuzzed. Parsing never throws and has
// a depth limit, so hostile input cannot overflow the stack.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "muse/core/status.h"

namespace muse {

class Json;
using JsonArray = std::vector<Json>;
using JsonMember = std::pair<std::string, Json>;
using JsonObject = std::vector<JsonMember>;  // insertion order kept

struct JsonParseOptions {
  int max_depth = 256;
  // Duplicate object keys: the last value wins, at the first key's position
  // (what Python's json module does). With `reject_duplicate_keys` it is an error.
  bool reject_duplicate_keys = false;
};

struct JsonDumpOptions {
  int indent = -1;              // < 0: one line
  bool ensure_ascii = false;    // escape non-ASCII as \uXXXX (Python's default)
  bool sort_keys = false;
  std::string_view item_separator = ",";
  std::string_view key_separator = ":";
  // Python's json.dumps(x) defaults: ", " and ": " on one line, ensure_ascii.
  static JsonDumpOptions python(int indent = -1, bool ensure_ascii = true) {
    JsonDumpOptions o;
    o.indent = indent;
    o.ensure_ascii = ensure_ascii;
    o.item_separator = indent < 0 ? ", " : ",";
    o.key_separator = ": ";
    return o;
  }
};

class Json {
 public:
  enum class Type : uint8_t { Null, Bool, Int, Double, String, Array, Object };

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool b) : v_(b) {}
  Json(int i) : v_(int64_t{i}) {}
  Json(int64_t i) : v_(i) {}
  Json(uint32_t i) : v_(int64_t{i}) {}
  Json(double d) : v_(d) {}
  Json(const char* s) : v_(std::string(s)) {}
  Json(std::string_view s) : v_(std::string(s)) {}
  Json(std::string s) : v_(std::move(s)) {}
  Json(JsonArray a) : v_(std::move(a)) {}
  Json(JsonObject o) : v_(std::move(o)) {}
  static Json array() { return Json(JsonArray{}); }
  static Json object() { return Json(JsonObject{}); }

  static Result<Json> parse(std::string_view text, const JsonParseOptions& options = {});
  std::string dump(const JsonDumpOptions& options = {}) const;
  void dump_to(std::string& out, const JsonDumpOptions& options = {}) const;

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_null() const { return type() == Type::Null; }
  bool is_bool() const { return type() == Type::Bool; }
  bool is_int() const { return type() == Type::Int; }
  bool is_double() const { return type() == Type::Double; }
  bool is_number() const { return is_int() || is_double(); }
  bool is_string() const { return type() == Type::String; }
  bool is_array() const { return type() == Type::Array; }
  bool is_object() const { return type() == Type::Object; }

  // Unchecked accessors: call only after the matching is_*().
  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_double() const { return is_int() ? double(std::get<int64_t>(v_)) : std::get<double>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  std::string& as_string() { return std::get<std::string>(v_); }
  const JsonArray& as_array() const { return std::get<JsonArray>(v_); }
  JsonArray& as_array() { return std::get<JsonArray>(v_); }
  const JsonObject& as_object() const { return std::get<JsonObject>(v_); }
  JsonObject& as_object() { return std::get<JsonObject>(v_); }

  // Object lookup; nullptr when absent or when this is not an object.
  const Json* find(std::string_view key) const;
  Json* find(std::string_view key);
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  // Insert-or-get on an object (turns null into an empty object).
  Json& operator[](std::string_view key);
  // Set a member (replacing in place if present). Returns *this for chaining.
  Json& set(std::string_view key, Json value);
  bool erase(std::string_view key);
  // Append to an array (turns null into an empty array).
  void push_back(Json value);
  size_t size() const;  // array/object element count, else 0

  // Typed member access with a default when absent or null. A present member
  // of the wrong type is still returned as the default: use the checked
  // getters below where a wrong type must be an error.
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_double(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key, std::string_view fallback) const;

  // Checked member access: absent -> fallback; wrong type -> error naming `key`.
  Result<int64_t> int_member(std::string_view key, int64_t fallback) const;
  Result<double> number_member(std::string_view key, double fallback) const;
  Result<bool> bool_member(std::string_view key, bool fallback) const;
  Result<std::string> string_member(std::string_view key, std::string_view fallback) const;

  bool operator==(const Json& other) const;

  static const char* type_name(Type t);
  const char* type_name() const { return type_name(type()); }

 private:
  std::variant<std::nullptr_t, bool, int64_t, double, std::string, JsonArray, JsonObject> v_;
};

// Appends `s` as a JSON string literal (with quotes) to `out`.
void json_escape_to(std::string& out, std::string_view s, bool ensure_ascii = false);
std::string json_quote(std::string_view s, bool ensure_ascii = false);
// Python repr() of a float: shortest round-trip digits, ".0" on integral values,
// exponent form outside 1e-4 <= |x| < 1e16 (e.g. 1e-05, 1e+16).
void format_python_float(std::string& out, double d);

// UTF-8 validation (RFC 3629: no overlongs, no surrogates, <= U+10FFFF).
// Returns the byte offset of the first invalid sequence, or npos when valid.
size_t find_invalid_utf8(std::string_view s);
inline bool is_valid_utf8(std::string_view s) { return find_invalid_utf8(s) == std::string_view::npos; }
// Appends the UTF-8 encoding of a code point.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace muse
