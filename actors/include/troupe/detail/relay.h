// Internal: a ref that follows an actor across incarnations (an actor of the
// cluster restarted in another process). Messages go to the current
// incarnation; when it is gone, a resolver finds the next one while messages
// wait (bounded), and asks that failed because their incarnation died are
// sent again, up to `max_retries` times each, before anything sent after
// them. When the resolver says there is no next one, everything waiting
// fails with its reason and the relay's cell stops (monitors see it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "troupe/detail/message.h"
#include "troupe/status.h"

namespace troupe {
class Runtime;
}

namespace troupe::detail {

class Relay : public std::enable_shared_from_this<Relay> {
 public:
  /// Called, from any thread, when the current incarnation is gone: must
  /// call `done` once, later or at once, with a ref to the next incarnation
  /// or with the error that says why there is none.
  using Resolver = std::function<void(std::function<void(Result<CellPtr>)> done)>;

  /// `first`: the incarnation now. `max_parked`: most messages that wait
  /// for the next one (more fail with mailbox_full).
  Relay(CellPtr first, Resolver resolve, uint32_t max_retries, size_t max_parked = 100'000);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  /// Sends (or parks) a message for the actor.
  Status send(Envelope&& env);
  /// The next incarnation, found by someone else than the resolver (a
  /// supervisor that restarted it): what waits goes there now. `first` may
  /// be empty, and the resolver do nothing, for relays retargeted this way.
  void retarget(CellPtr next);

  struct State;

 private:
  friend CellPtr spawn_relay(Runtime& rt, std::shared_ptr<Relay> relay, std::string name);
  std::shared_ptr<State> state_;
};

/// A cell that stands for the actor behind `relay`: what ActorRef holds.
CellPtr spawn_relay(Runtime& rt, std::shared_ptr<Relay> relay, std::string name);

}  // namespace troupe::detail
