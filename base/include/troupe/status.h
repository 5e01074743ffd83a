// Errors as values: every fallible troupe call returns a Status or a Result<T>.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace troupe {

/// What went wrong, as a machine-checkable code. Each code has one meaning
/// across the whole runtime; the Status message says the details.
enum class ErrorCode : uint8_t {
  ok = 0,
  /// A wait (ask, shutdown, start) ran past its deadline.
  timeout,
  /// The target actor is not running: it stopped before or while the message
  /// was queued, or it never existed.
  actor_dead,
  /// The handler threw or called fail(); the message carries the reason.
  handler_failed,
  /// The actor has no handler for the message type it was sent.
  unknown_message,
  /// The target's mailbox is at its bound; the message was not queued.
  mailbox_full,
  /// A caller passed a value the API cannot accept.
  invalid_argument,
  /// An actor or supervisor could not start (its on_start failed).
  start_failed,
  /// The runtime is shutting down and refused new work.
  shutting_down,
  /// A reply had a different type than the asker expected.
  type_mismatch,
  /// A named thing (child, actor) does not exist.
  not_found,
  /// A named thing already exists.
  already_exists,
  /// The process hosting the target is unreachable (connection lost, peer
  /// killed, network gone).
  peer_lost,
  /// The peer refused the connection (wrong token, protocol version).
  refused,
  /// Bytes from a peer could not be decoded (malformed, truncated, unknown).
  malformed,
  /// The operation is not available here (a transport without one-sided
  /// access, a build without CUDA).
  unsupported,
  /// Durable storage failed (a full disk, an I/O error); nothing was lost
  /// that had been written before.
  storage,
};

/// A stable lowercase name for a code, e.g. "actor_dead".
std::string_view error_code_name(ErrorCode code);

/// The outcome of an operation: ok, or a code plus a human message written as
/// "context: what went wrong, what to do".
class Status {
 public:
  /// An ok status.
  Status() = default;
  /// A failed status; `code` must not be ErrorCode::ok.
  Status(ErrorCode code, std::string message);

  /// True when the operation succeeded.
  bool ok() const { return code_ == ErrorCode::ok; }
  /// The error code (ErrorCode::ok on success).
  ErrorCode code() const { return code_; }
  /// The human-readable message (empty on success).
  const std::string& message() const { return message_; }
  /// "code: message", or "ok".
  std::string to_string() const;

  friend bool operator==(const Status&, const Status&) = default;

 private:
  ErrorCode code_ = ErrorCode::ok;
  std::string message_;
};

/// The error side of a Result, as built by error(). Converts to any Result<T>.
struct Unexpected {
  Status status;
};

/// Builds the error side of a Result: `return error(ErrorCode::timeout, "...")`.
inline Unexpected error(ErrorCode code, std::string message) { return {Status(code, std::move(message))}; }

/// Builds the error side of a Result from an existing Status (must not be ok).
inline Unexpected error(Status status) { return {std::move(status)}; }

namespace detail {
[[noreturn]] void bad_result_access(const Status& status);
}

/// A value, or the Status that explains why there is none. (troupe's own
/// type rather than std::expected, which libstdc++ 12 does not offer to
/// clang; the interface is the same subset.)
template <class T>
class [[nodiscard]] Result {
 public:
  using value_type = T;

  Result(const T& value) : v_(std::in_place_index<0>, value) {}
  Result(T&& value) : v_(std::in_place_index<0>, std::move(value)) {}
  template <class U>
    requires(std::is_constructible_v<T, U &&> && !std::is_same_v<std::remove_cvref_t<U>, Result> &&
             !std::is_same_v<std::remove_cvref_t<U>, Unexpected> && !std::is_same_v<std::remove_cvref_t<U>, T>)
  Result(U&& value) : v_(std::in_place_index<0>, std::forward<U>(value)) {}
  Result(Unexpected e) : v_(std::in_place_index<1>, std::move(e.status)) {}

  /// True when there is a value.
  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  /// The value; a Result holding an error aborts with its message.
  T& value() & {
    check();
    return std::get<0>(v_);
  }
  const T& value() const& {
    check();
    return std::get<0>(v_);
  }
  T&& value() && {
    check();
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The value, or `fallback` when there is an error.
  template <class U>
  T value_or(U&& fallback) const& {
    return has_value() ? std::get<0>(v_) : static_cast<T>(std::forward<U>(fallback));
  }

  /// The error. REQUIRES: !has_value().
  const Status& error() const& { return std::get<1>(v_); }
  Status& error() & { return std::get<1>(v_); }

  /// A Result equals a value when it holds that value.
  friend bool operator==(const Result& r, const T& v) { return r.has_value() && *r == v; }

 private:
  void check() const {
    if (!has_value()) detail::bad_result_access(std::get<1>(v_));
  }
  std::variant<T, Status> v_;
};

/// A Result with no value: ok, or an error.
template <>
class [[nodiscard]] Result<void> {
 public:
  using value_type = void;

  Result() = default;
  Result(Unexpected e) : error_(std::move(e.status)) {}

  bool has_value() const { return error_.ok(); }
  explicit operator bool() const { return has_value(); }
  /// Aborts with the message when there is an error.
  void value() const {
    if (!has_value()) detail::bad_result_access(error_);
  }
  /// The error. REQUIRES: !has_value().
  const Status& error() const& { return error_; }
  Status& error() & { return error_; }

 private:
  Status error_;
};

/// Collapses a Result<void> to a Status.
inline Status to_status(const Result<void>& r) { return r ? Status() : r.error(); }

}  // namespace troupe
