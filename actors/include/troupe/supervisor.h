// Supervision trees with Erlang/OTP semantics (strategies, restart intensity,
// restart types, shutdown specs, ordered start and reverse-order stop) plus
// Akka's restart-with-backoff. See docs/supervision.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actor.h"
#include "troupe/actor_ref.h"
#include "troupe/detail/spawn.h"
#include "troupe/exit_reason.h"
#include "troupe/status.h"

namespace troupe {

/// Which children a supervisor restarts when one of them exits.
enum class Strategy : uint8_t {
  /// Only the child that exited.
  one_for_one,
  /// All children: the others are stopped in reverse start order, then all
  /// are started again in order.
  one_for_all,
  /// The child that exited and every child started after it.
  rest_for_one,
  /// Like one_for_one, for dynamic children of one kind added with
  /// start_child(); the spec's single child is their template.
  simple_one_for_one,
};

/// Whether a child is restarted when it exits.
enum class Restart : uint8_t {
  /// Always restarted.
  permanent,
  /// Restarted only after an abnormal exit (failed, killed).
  transient,
  /// Never restarted; removed when it exits.
  temporary,
};

/// Names for logs: "one_for_one", "transient", ...
std::string_view strategy_name(Strategy s);
std::string_view restart_name(Restart r);

/// Shutdown value meaning "wait as long as it takes" (OTP's infinity).
inline constexpr std::chrono::milliseconds kInfinity = std::chrono::milliseconds::max();
/// Shutdown value meaning "the default for the kind": 5000 ms for workers,
/// infinity for supervisors (OTP's defaults).
inline constexpr std::chrono::milliseconds kDefaultShutdown{-1};

/// Exponential restart backoff (Akka's BackoffSupervisor): the n-th restart in
/// a row waits min(max, min * 2^n) * (1 + random in [0, random_factor]). The
/// count resets when the child has run for `reset_after` without exiting.
struct Backoff {
  std::chrono::milliseconds min{100};
  std::chrono::milliseconds max{10'000};
  double random_factor = 0.2;
  std::chrono::milliseconds reset_after{10'000};

  /// The delay before restart number `attempt` (0-based), for a random draw
  /// `unit_random` in [0, 1).
  std::chrono::microseconds delay(uint32_t attempt, double unit_random) const;
};

/// One child of a supervisor: what to start and how to treat its exits.
struct ChildSpec {
  /// Unique among the supervisor's children; the last segment of its path.
  std::string name{};
  Restart restart = Restart::permanent;
  /// Graceful stop budget before the child is abandoned (see docs):
  /// kDefaultShutdown, kInfinity or a number of milliseconds.
  std::chrono::milliseconds shutdown = kDefaultShutdown;
  /// Delay restarts with exponential backoff; none restarts at once.
  std::optional<Backoff> backoff{};
  /// Internal: how to create instances.
  detail::SpawnSpec spawn{};

  ChildSpec& with_restart(Restart r) {
    restart = r;
    return *this;
  }
  ChildSpec& with_shutdown(std::chrono::milliseconds ms) {
    shutdown = ms;
    return *this;
  }
  ChildSpec& with_backoff(Backoff b) {
    backoff = b;
    return *this;
  }
};

/// A supervisor's configuration.
struct SupervisorSpec {
  Strategy strategy = Strategy::one_for_one;
  /// More than `intensity` restarts within `period` and the supervisor gives
  /// up: it stops all children in reverse order, then exits abnormally, and
  /// its own supervisor handles that (escalation). OTP default: 1 in 5 s.
  uint32_t intensity = 1;
  std::chrono::milliseconds period{5000};
  /// Started in order, stopped in reverse order.
  std::vector<ChildSpec> children{};
};

/// A worker child of actor class A, built from `args` on every (re)start.
template <class A, class... Args>
ChildSpec worker(std::string name, Args&&... args) {
  ChildSpec c;
  c.spawn = detail::make_spawn_spec<A>(SpawnOptions{name, 0, 0}, std::forward<Args>(args)...);
  c.name = std::move(name);
  return c;
}

/// A worker child with spawn options (mailbox bound, snapshot period).
template <class A, class... Args>
ChildSpec worker_with(std::string name, SpawnOptions options, Args&&... args) {
  options.name = name;
  ChildSpec c;
  c.spawn = detail::make_spawn_spec<A>(std::move(options), std::forward<Args>(args)...);
  c.name = std::move(name);
  return c;
}

/// A nested supervisor child.
ChildSpec supervisor(std::string name, SupervisorSpec spec);

/// What which_children() reports about one child.
struct ChildInfo {
  std::string name;
  /// Empty while the child is not running (temporary exited, or between a
  /// crash and its restart for nested supervisors).
  AnyRef ref;
  bool running = false;
  bool is_supervisor = false;
  uint32_t restarts = 0;
  std::string actor_type;
};

/// The structured record of one crash, logged as one line and passed to
/// RuntimeConfig::on_crash_report.
struct CrashReport {
  /// Path of the actor that exited.
  std::string actor;
  /// Path of the supervisor that decided ("" for unsupervised actors).
  std::string supervisor;
  ExitReason reason;
  /// Restarts of this child before this exit.
  uint32_t restart_count = 0;
  Strategy strategy = Strategy::one_for_one;
  /// "restart", "restart_after_backoff", "ignore", "remove", "escalate", "terminate".
  std::string decision;

  /// One line of key=value pairs.
  std::string to_string() const;
};

namespace detail {
// Supervisor protocol messages (handled by the built-in supervisor actor).
struct WhichChildren {};
struct GetChild {
  std::string name;
};
struct StartChild {
  ChildSpec spec;
};
struct TerminateChild {
  std::string name;
};
struct RestartChild {
  std::string name;
};
struct DeleteChild {
  std::string name;
};
}  // namespace detail

/// A handle to a supervisor. The calls block (up to `timeout`) and are for
/// code outside actors; actors ask the supervisor's ref() directly.
class SupervisorRef {
 public:
  SupervisorRef() = default;
  explicit SupervisorRef(AnyRef ref) : ref_(std::move(ref)) {}

  /// The supervisor actor.
  const AnyRef& ref() const { return ref_; }

  /// The current reference of a child, checked against its class.
  template <class A>
  Result<ActorRef<A>> child(const std::string& name, std::chrono::milliseconds timeout = kDefaultTimeout) const {
    auto any = child_ref(name, timeout);
    if (!any) return error(any.error());
    return ActorRef<A>::from(*any);
  }
  /// The current reference of a child.
  Result<AnyRef> child_ref(const std::string& name,
                           std::chrono::milliseconds timeout = kDefaultTimeout) const {
    return ref_.ask<AnyRef>(detail::GetChild{name}, timeout).get();
  }
  /// All children in start order.
  Result<std::vector<ChildInfo>> which_children(std::chrono::milliseconds timeout = kDefaultTimeout) const {
    return ref_.ask<std::vector<ChildInfo>>(detail::WhichChildren{}, timeout).get();
  }
  /// Adds and starts a child (not for simple_one_for_one).
  Result<AnyRef> start_child(ChildSpec spec, std::chrono::milliseconds timeout = kDefaultTimeout) const {
    return ref_.ask<AnyRef>(detail::StartChild{std::move(spec)}, timeout).get();
  }
  /// simple_one_for_one: starts a new child of the template's kind, built
  /// from `args`. The child is named "<template name>-<n>".
  template <class A, class... Args>
  Result<ActorRef<A>> start_child(Args&&... args) const {
    auto any = start_child(worker<A>(std::string(), std::forward<Args>(args)...));
    if (!any) return error(any.error());
    return ActorRef<A>::from(*any);
  }
  /// Stops a child (its spec stays; restart_child starts it again).
  Status terminate_child(const std::string& name, std::chrono::milliseconds timeout = kDefaultTimeout) const {
    return to_status(ref_.ask<void>(detail::TerminateChild{name}, timeout).get());
  }
  /// Starts a terminated child again.
  Result<AnyRef> restart_child(const std::string& name, std::chrono::milliseconds timeout = kDefaultTimeout) const {
    return ref_.ask<AnyRef>(detail::RestartChild{name}, timeout).get();
  }
  /// Removes the spec of a terminated child.
  Status delete_child(const std::string& name, std::chrono::milliseconds timeout = kDefaultTimeout) const {
    return to_status(ref_.ask<void>(detail::DeleteChild{name}, timeout).get());
  }

 private:
  AnyRef ref_;
};

}  // namespace troupe
