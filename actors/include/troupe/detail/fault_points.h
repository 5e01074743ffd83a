// Internal, for tests: points where a test may hold the runtime inside a
// window that a race would otherwise need luck to hit (a few microseconds
// on a loaded machine). Nothing is set unless a test sets it; an unset point
// costs one relaxed atomic load.
#pragma once

#include <functional>
#include <string>

namespace troupe::detail::faults {

/// Runs `hook(address)` in this process at the start of the handling of every
/// lost connection, on the transport's thread, before any proxy, ask or relay
/// learns of the loss (the transport already refuses sends on it). A hook that
/// waits holds that handling, and every other event of the transport, so it
/// must wait bounded. An empty function removes the hook.
void set_before_peer_lost(std::function<void(const std::string& address)> hook);

}  // namespace troupe::detail::faults
