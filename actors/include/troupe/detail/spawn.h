// Internal: what the runtime needs to create (and re-create) an actor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "troupe/detail/message.h"

namespace troupe {

class ActorBase;

/// Options for spawning an actor.
struct SpawnOptions {
  /// Last path segment; empty gives "actor-<id>".
  std::string name{};
  /// Most messages its mailbox holds before tell/ask fail with mailbox_full
  /// (0: the runtime's default).
  size_t mailbox_bound = 0;
  /// Take a snapshot() after every N handled messages (0: only on
  /// checkpoint() and graceful stops).
  uint32_t snapshot_every = 0;
};

namespace detail {

class RuntimeImpl;
/// Where a proxy cell's messages go (remote/node.h).
struct RemoteTarget;
class Relay;

/// Makes a fresh instance; called once per incarnation.
using Factory = std::function<std::unique_ptr<ActorBase>()>;

struct SpawnSpec {
  std::string name;
  Factory factory;
  TypeKey actor_type = nullptr;
  const std::string& (*actor_type_name)() = nullptr;
  size_t mailbox_bound = 0;
  uint32_t snapshot_every = 0;
  bool is_supervisor = false;
  /// Set for proxies of actors in other processes.
  std::shared_ptr<RemoteTarget> remote{};
  /// Set for refs that follow an actor across incarnations (relay.h).
  std::shared_ptr<Relay> relay{};
  /// The full path, when the runtime should not derive one.
  std::string path{};
  /// The state the first incarnation restores (a restart on another process
  /// carries its last snapshot this way).
  std::optional<std::string> snapshot{};
  /// Called on the actor's thread with every snapshot it takes, so that the
  /// state can be kept outside this process (the cluster's head).
  std::function<void(const std::string&)> on_snapshot{};
};

template <class A, class... Args>
SpawnSpec make_spawn_spec(SpawnOptions options, Args&&... args) {
  static_assert(std::is_base_of_v<ActorBase, A>, "spawn: the class must derive from troupe::Actor");
  static_assert((std::is_copy_constructible_v<std::decay_t<Args>> && ...),
                "spawn: constructor arguments must be copyable (a restart builds a new instance "
                "from the same arguments)");
  SpawnSpec spec;
  spec.name = std::move(options.name);
  spec.factory = [... captured = std::forward<Args>(args)]() -> std::unique_ptr<ActorBase> {
    return std::unique_ptr<ActorBase>(new A(captured...));
  };
  spec.actor_type = type_key<A>();
  spec.actor_type_name = &type_name<A>;
  spec.mailbox_bound = options.mailbox_bound;
  spec.snapshot_every = options.snapshot_every;
  return spec;
}

/// Spawns an unsupervised actor; an empty CellPtr if the runtime is shutting down.
CellPtr spawn_in(RuntimeImpl* rt, SpawnSpec spec);

}  // namespace detail
}  // namespace troupe
