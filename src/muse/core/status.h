// Errors as values. Every parser and loader returns Result<T> or Status; the
// caller decides how to report. Nothing in the library throws across an API.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace muse {

// A failure a user can act on: the message names the thing that is wrong
// (file, tensor, key, byte offset) and, where possible, what was expected.
struct Error {
  std::string message;
};

inline Error make_error(std::string message) { return Error{std::move(message)}; }

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Error error) : v_(std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { assert(!ok()); return std::get<1>(v_); }
  const std::string& message() const { return error().message; }

 private:
  std::variant<T, Error> v_;
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : failed_(true), error_(std::move(error)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return error_; }
  const std::string& message() const { return error_.message; }

 private:
  bool failed_ = false;
  Error error_;
};

}  // namespace muse

// Propagate a failed Status/Result from the current function.
#define MUSE_CONCAT_INNER(a, b) a##b
#define MUSE_CONCAT(a, b) MUSE_CONCAT_INNER(a, b)
#define MUSE_RETURN_IF_ERROR(expr)                     \
  do {                                                 \
    auto&& muse_status_ = (expr);                      \
    if (!muse_status_.ok()) return muse_status_.error(); \
  } while (0)
// MUSE_ASSIGN_OR_RETURN(auto x, f()) declares x from a Result or returns its error.
#define MUSE_ASSIGN_OR_RETURN(decl, expr) \
  MUSE_ASSIGN_OR_RETURN_IMPL(MUSE_CONCAT(muse_result_, __LINE__), decl, expr)
#define MUSE_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.error();                \
  decl = std::move(tmp).value()
