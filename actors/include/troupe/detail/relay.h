// Internal: a ref that follows an actor across incarnations (an actor of the
// cluster restarted in another process). Messages go to the current
// incarnation; when it is gone, a resolver finds the next one while messages
// wait (bounded), and asks that failed because their incarnation died are
// sent again, up to `max_retries` times each, before anything sent after
// them. When the resolver says there is no next one, everything waiting
// fails with its reason and the relay's cell stops (monitors see it). When
// the cell that stands for the actor stops for good (a supervisor that gave
// up on it), what waits ends with it: asks fail at once, tells are dropped.
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
  /// Cell `cell_id` stands for the actor now (each cell made with this relay
  /// says so as it is made; a supervisor may replace a child's cell).
  void adopt(uint64_t cell_id);
  /// Cell `cell_id` has stopped for good. If it still stands for the actor,
  /// asks waiting for the next incarnation (and asks in flight that come
  /// back to be retried) fail with `why`, and waiting tells are dropped and
  /// counted in the log, rather than waiting for an incarnation no one will
  /// start. A later retarget() opens the relay again.
  void close(uint64_t cell_id, Status why);
  /// The incarnation messages go to now; empty while it is being looked
  /// for (or gone for good).
  CellPtr current() const;

  struct State;

 private:
  friend CellPtr spawn_relay(Runtime& rt, std::shared_ptr<Relay> relay, std::string name);
  std::shared_ptr<State> state_;
};

/// A cell that stands for the actor behind `relay`: what ActorRef holds.
CellPtr spawn_relay(Runtime& rt, std::shared_ptr<Relay> relay, std::string name);
/// The relay behind a cell, or null for other cells.
Relay* relay_of(CellControl* cell);

// Messages in encoded form, for runtime code that forwards them without
// knowing their types (a mesh's tree cast). `context` is any cell of the
// runtime whose network node encodes and resolves refs.

/// The wire id and bytes of a message (it must be a TROUPE_MESSAGE type).
Result<std::pair<uint64_t, std::string>> encode_message(CellControl* context, const MessageBox& box);
/// The cell of actor `id` at `address` (local, or a proxy).
Result<CellPtr> cell_at(CellControl* context, const std::string& address, uint64_t id);
/// Rebuilds a message and tells it to `to`.
Status tell_encoded(CellControl* context, CellControl* to, uint64_t wire_id, std::string_view bytes);

}  // namespace troupe::detail
