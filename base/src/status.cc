#include "troupe/status.h"

#include <cstdio>
#include <cstdlib>

namespace troupe {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::actor_dead: return "actor_dead";
    case ErrorCode::handler_failed: return "handler_failed";
    case ErrorCode::unknown_message: return "unknown_message";
    case ErrorCode::mailbox_full: return "mailbox_full";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::start_failed: return "start_failed";
    case ErrorCode::shutting_down: return "shutting_down";
    case ErrorCode::type_mismatch: return "type_mismatch";
    case ErrorCode::not_found: return "not_found";
    case ErrorCode::already_exists: return "already_exists";
    case ErrorCode::peer_lost: return "peer_lost";
    case ErrorCode::refused: return "refused";
    case ErrorCode::malformed: return "malformed";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::storage: return "storage";
  }
  return "unknown_error_code";
}

Status::Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {
  if (code == ErrorCode::ok) {
    // An "error" that says ok would make callers treat a failure as success.
    std::fprintf(stderr, "troupe: Status built with ErrorCode::ok and message '%s'\n", message_.c_str());
    std::abort();
  }
}

namespace detail {
void bad_result_access(const Status& status) {
  std::fprintf(stderr, "troupe: value() of a Result that holds an error: %s\n", status.to_string().c_str());
  std::abort();
}
}  // namespace detail

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string s(error_code_name(code_));
  s += ": ";
  s += message_;
  return s;
}

}  // namespace troupe
