// Why an actor (or one incarnation of it) stopped.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace troupe {

/// Why an actor or one of its incarnations ended. Follows Erlang's reasons:
/// `normal` and `shutdown` are normal exits (a transient child is not
/// restarted after them), `failed` and `killed` are abnormal (crashes).
struct ExitReason {
  enum class Kind : uint8_t {
    /// The actor called stop(), or finished its work.
    normal,
    /// It was asked to stop (by its supervisor, the runtime or stop()).
    shutdown,
    /// It crashed: an exception escaped a handler, it called fail(), or a
    /// linked actor exited abnormally.
    failed,
    /// It was stopped without a graceful shutdown (shutdown timeout, or its
    /// supervisor gave up).
    killed,
  };

  Kind kind = Kind::normal;
  /// Details, e.g. the exception's message.
  std::string message{};

  /// True for crashes (failed, killed).
  bool abnormal() const { return kind == Kind::failed || kind == Kind::killed; }
  /// "normal", "shutdown: ...", "failed: ...", "killed: ...".
  std::string to_string() const;

  static ExitReason normal_exit() { return {Kind::normal, {}}; }
  static ExitReason shutdown(std::string why = {}) { return {Kind::shutdown, std::move(why)}; }
  static ExitReason failure(std::string why) { return {Kind::failed, std::move(why)}; }
  static ExitReason killed(std::string why) { return {Kind::killed, std::move(why)}; }

  friend bool operator==(const ExitReason&, const ExitReason&) = default;
};

}  // namespace troupe
