// Error values used inside libxpack. No exception crosses a module boundary:
// functions that can fail return Result<T> (a value or an Error), and the C API
// turns an Error into its int code plus a message.
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "xpack/xpack.h"

namespace xpack {

struct Error {
  int code = XPACK_E_INTERNAL;  // negative errno or XPACK_E_*
  std::string message;
};

// Builds an Error with a formatted message: err(XPACK_E_FORMAT, "bad {}", x).
template <typename... Args>
Error err(int code, fmt::format_string<Args...> f, Args&&... args) {
  return Error{code, fmt::format(f, std::forward<Args>(args)...)};
}

// Error from the current errno, e.g. errno_error("open {}", path).
template <typename... Args>
Error errno_error(fmt::format_string<Args...> f, Args&&... args) {
  int e = errno;
  std::string what = fmt::format(f, std::forward<Args>(args)...);
  return Error{-e, fmt::format("{}: {}", what, xpack_strerror(-e))};
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Error e) : v_(std::move(e)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error e) : e_(std::move(e)), ok_(false) {}
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const& { return e_; }
  Error&& error() && { return std::move(e_); }

 private:
  Error e_{XPACK_OK, {}};
  bool ok_ = true;
};

using Status = Result<void>;

}  // namespace xpack

// Propagates an error from an expression returning Result<...>/Status.
#define XPACK_TRY(expr)                                   \
  do {                                                    \
    auto xpack_try_r_ = (expr);                           \
    if (!xpack_try_r_.ok()) return std::move(xpack_try_r_).error(); \
  } while (0)

// Assigns the value of a Result<T> expression to `lhs` or propagates its error.
#define XPACK_CONCAT_INNER_(a, b) a##b
#define XPACK_CONCAT_(a, b) XPACK_CONCAT_INNER_(a, b)
#define XPACK_ASSIGN_OR_RETURN(lhs, expr) \
  XPACK_ASSIGN_OR_RETURN_IMPL_(XPACK_CONCAT_(xpack_r_, __LINE__), lhs, expr)
#define XPACK_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).error();      \
  lhs = std::move(tmp).value()
