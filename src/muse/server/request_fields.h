// Typed, range-checked reads of request members, shared by the OpenAI and
// Anthropic validators. Absent and null members leave the output untouched.
// The first failure is kept; later reads are no-ops, so validators read in a
// straight line and check `error` once at the end.
#pragma once

#include <cmath>
#include <optional>
#include <string>

#include "muse/core/json.h"
#include "muse/server/api_error.h"

namespace muse::server {

class FieldReader {
 public:
  explicit FieldReader(const Json& body) : body_(body) {}

  std::optional<ApiError> error;
  bool failed() const { return error.has_value(); }

  const Json* get(const char* key) const {
    const Json* v = body_.find(key);
    return v && !v->is_null() ? v : nullptr;
  }

  // A number in [lo, hi]; `lo_open` makes the lower bound exclusive.
  bool number(const char* key, double* out, double lo, double hi, bool lo_open = false) {
    const Json* v = get(key);
    if (!v || failed()) return false;
    if (!v->is_number()) return fail(invalid_type(key, "a number", json_kind(*v)));
    double x = v->as_double();
    if (!std::isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi)
      return fail(invalid_param(key, "Invalid '" + std::string(key) + "': expected a number " + (lo_open ? "> " : ">= ") +
                                         fmt(lo) + " and <= " + fmt(hi) + ", but got " + fmt(x) + "."));
    *out = x;
    return true;
  }

  // An integer in [lo, hi]; 3.0 counts as 3 (as pydantic's lax mode does).
  bool integer(const char* key, int64_t* out, int64_t lo, int64_t hi) {
    const Json* v = get(key);
    if (!v || failed()) return false;
    int64_t x = 0;
    if (v->is_int()) x = v->as_int();
    else if (v->is_double() && std::isfinite(v->as_double()) && v->as_double() == std::floor(v->as_double()) &&
             std::fabs(v->as_double()) < 9e15)
      x = int64_t(v->as_double());
    else return fail(invalid_type(key, "an integer", json_kind(*v)));
    if (x < lo || x > hi)
      return fail(invalid_param(key, "Invalid '" + std::string(key) + "': expected an integer >= " + std::to_string(lo) +
                                         " and <= " + std::to_string(hi) + ", but got " + std::to_string(x) + "."));
    *out = x;
    return true;
  }

  bool boolean(const char* key, bool* out) {
    const Json* v = get(key);
    if (!v || failed()) return false;
    if (!v->is_bool()) return fail(invalid_type(key, "a boolean", json_kind(*v)));
    *out = v->as_bool();
    return true;
  }

  bool string(const char* key, std::string* out) {
    const Json* v = get(key);
    if (!v || failed()) return false;
    if (!v->is_string()) return fail(invalid_type(key, "a string", json_kind(*v)));
    *out = v->as_string();
    return true;
  }

  // Present (non-null) member of the given JSON type, or a type error.
  const Json* typed(const char* key, Json::Type type, const char* expected) {
    const Json* v = get(key);
    if (!v || failed()) return nullptr;
    if (v->type() != type) {
      fail(invalid_type(key, expected, json_kind(*v)));
      return nullptr;
    }
    return v;
  }

  bool fail(ApiError e) {
    if (!error) error = std::move(e);
    return false;
  }

  static const char* json_kind(const Json& v) {
    switch (v.type()) {
      case Json::Type::Null: return "null";
      case Json::Type::Bool: return "a boolean";
      case Json::Type::Int: return "an integer";
      case Json::Type::Double: return "a number";
      case Json::Type::String: return "a string";
      case Json::Type::Array: return "an array";
      case Json::Type::Object: return "an object";
    }
    return "a value";
  }

  static std::string fmt(double x) {
    std::string s;
    format_python_float(s, x);
    if (s.size() > 2 && s.ends_with(".0")) s.resize(s.size() - 2);
    return s;
  }

 private:
  const Json& body_;
};

}  // namespace muse::server
