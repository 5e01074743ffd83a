// Errors as values: every fallible troupe call returns a Status or a Result<T>.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <utility>

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

/// A value or the Status that explains why there is none.
template <class T>
using Result = std::expected<T, Status>;

/// Builds the error side of a Result: `return error(ErrorCode::timeout, "...")`.
inline std::unexpected<Status> error(ErrorCode code, std::string message) {
  return std::unexpected<Status>(Status(code, std::move(message)));
}

/// Builds the error side of a Result from an existing Status (must not be ok).
inline std::unexpected<Status> error(Status status) {
  return std::unexpected<Status>(std::move(status));
}

/// Collapses a Result<void> to a Status.
inline Status to_status(const Result<void>& r) { return r ? Status() : r.error(); }

}  // namespace troupe
