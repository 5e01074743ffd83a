// Internal, for tests: points where a test may hold the runtime inside a
// window that a race would otherwise need luck to hit (a few microseconds
// on a loaded machine). Nothing is set unless a test sets it; an unset point
// costs one relaxed atomic load.
#pragma once

#include <functional>
#include <string>

namespace troupe::detail::faults {

/// Where a hook runs. Each gets the address of the peer concerned.
enum class Point {
  /// At the start of the handling of a lost connection, on the transport's
  /// thread, before any proxy, ask or relay learns of the loss (the
  /// transport already refuses sends on it).
  before_peer_lost,
  /// Once that handling is done: proxies are marked lost, and the asks in
  /// flight have failed.
  after_peer_lost,
  /// On the sender's thread, when an ask to a remote actor has been
  /// registered for its answer and its frame is about to go to the
  /// transport.
  before_ask_sent,
};

/// Runs `hook(address)` in this process at `point`. A hook that waits holds
/// that thread (before_peer_lost and after_peer_lost: every other event of
/// the transport too), so it must wait bounded. An empty function removes
/// the hook.
void set(Point point, std::function<void(const std::string& address)> hook);

/// Runs the hook set at `point`, if any (the runtime's side).
void reach(Point point, const std::string& address);
/// Whether a hook is set at `point`: lets a caller skip finding the address.
bool armed(Point point);

}  // namespace troupe::detail::faults
