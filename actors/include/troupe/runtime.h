// The blocking handle a program's main() holds: it owns the scheduler and all
// actors, and its shutdown stops them in order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "troupe/actor.h"
#include "troupe/actor_ref.h"
#include "troupe/detail/spawn.h"
#include "troupe/exit_reason.h"
#include "troupe/future.h"
#include "troupe/remote_buffer.h"
#include "troupe/status.h"
#include "troupe/supervisor.h"

namespace troupe {

class Runtime;
namespace detail {
/// Spawns an unsupervised actor from a prepared spec (cluster workers build
/// specs from encoded constructor arguments).
CellPtr spawn_from_spec(Runtime& rt, SpawnSpec spec);
/// As above; `started` gets the first start's outcome (ok once the
/// constructor and on_start succeeded, else why not), on some thread of the
/// runtime's, once.
CellPtr spawn_from_spec(Runtime& rt, SpawnSpec spec, std::function<void(Status)> started);
}  // namespace detail

/// How a Runtime is set up. Every field has a working default.
struct RuntimeConfig {
  /// Scheduler threads; 0 means one per core.
  size_t threads = 0;
  /// Timeout of asks that pass kDefaultTimeout.
  std::chrono::milliseconds default_ask_timeout{30'000};
  /// Mailbox bound of actors whose spawn options give none.
  size_t default_mailbox_bound = 1'000'000;
  /// How long shutdown() waits for all actors before giving up (it then
  /// reports which actors are stuck).
  std::chrono::milliseconds shutdown_timeout{30'000};
  /// spdlog level name: trace, debug, info, warn, error, off. Empty: the
  /// TROUPE_LOG_LEVEL environment variable, else "info".
  std::string log_level{};
  /// Called (on a scheduler thread; keep it short) with every crash report.
  std::function<void(const CrashReport&)> on_crash_report{};
  /// Seed for restart-backoff jitter; 0 picks a random seed.
  uint64_t seed = 0;
  /// Idle scheduler threads sleep at once instead of first polling with
  /// short sleeps. Better for processes whose work arrives from the network
  /// (cross-process round trip halved in bench/transports), worse for one
  /// in-process sender flooding one actor (see docs/architecture.md).
  bool sleep_when_idle = false;
  /// How long an idle scheduler thread polls the network (once this runtime
  /// has a network node) before it goes to sleep. Frames it receives run on
  /// it with no thread hand-off: the difference between a cross-process
  /// round trip of a few microseconds and one of tens. At most one thread
  /// per process spins. 0: never; the network thread alone receives.
  std::chrono::microseconds network_spin{100};

  /// Network: where to accept connections from other processes, e.g.
  /// "tcp://0.0.0.0:7000" or "tcp://127.0.0.1:0" (any free port; see
  /// address()). Empty: this runtime only dials out (resolve()).
  std::string listen{};
  /// "tcp" or "ucx": the transport when `listen` names none (or is empty).
  std::string transport = "tcp";
  /// The secret every process of a cluster shares. Empty: the
  /// TROUPE_CLUSTER_TOKEN environment variable, else $TROUPE_HOME (default
  /// ~/.troupe)/cluster_token, created on first use.
  std::string cluster_token{};
  /// Largest message payload accepted from a peer.
  uint64_t max_frame_bytes = uint64_t{1} << 30;
  /// Bytes a connection may hold queued for a peer that reads slowly (or
  /// not at all) before sends to it fail with mailbox_full; the connection
  /// goes on once the peer reads again.
  uint64_t max_send_queue_bytes = uint64_t{2} << 30;
  /// Heartbeats on idle connections, and how long a silent peer lives.
  std::chrono::milliseconds heartbeat_interval{250};
  std::chrono::milliseconds peer_dead_after{2000};
  /// A peer sending a large frame over UCX (rendezvous) may stay silent for
  /// its bytes at this rate on top of peer_dead_after: its heartbeats wait
  /// behind the frame, and UCX shows no progress of one. 0: no allowance.
  uint64_t slowest_frame_bytes_per_s = uint64_t{64} << 20;
};

/// Owns an actor system. Create one per process (more work, but each is
/// independent); destroying it shuts it down.
class Runtime {
 public:
  explicit Runtime(RuntimeConfig config = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Starts an unsupervised actor of class A built from `args`. It lives
  /// until it stops, crashes (there is no supervisor to restart it) or the
  /// runtime shuts down. Returns an empty ref after shutdown began.
  template <class A, class... Args>
  ActorRef<A> spawn(Args&&... args) {
    return ActorRef<A>(detail::spawn_in(impl_.get(), detail::make_spawn_spec<A>(
                                                         SpawnOptions{}, std::forward<Args>(args)...)));
  }

  /// Like spawn(), with options (name, mailbox bound, snapshot period).
  template <class A, class... Args>
  ActorRef<A> spawn_with(SpawnOptions options, Args&&... args) {
    return ActorRef<A>(detail::spawn_in(
        impl_.get(), detail::make_spawn_spec<A>(std::move(options), std::forward<Args>(args)...)));
  }

  /// Starts a supervision tree and waits until all of its children have
  /// started (in order), or returns why one could not start.
  Result<SupervisorRef> start_supervisor(std::string name, SupervisorSpec spec,
                                         std::chrono::milliseconds timeout = kDefaultTimeout);

  /// A future that completes with the reason once `actor` has stopped for
  /// good, or fails with timeout after `timeout`.
  Future<ExitReason> monitor(const AnyRef& actor, std::chrono::milliseconds timeout = kDefaultTimeout);

  /// Asks `actor` to stop: an unsupervised actor stops for good; a
  /// supervised one exits with reason shutdown and its supervisor decides.
  void stop(const AnyRef& actor);

  /// Actors currently alive in this runtime.
  size_t live_actors() const;

  /// This runtime's address for other processes ("tcp://127.0.0.1:41234"),
  /// or "" when it does not listen.
  std::string address() const;
  /// Makes `actor` reachable from other processes as `name`.
  Status publish(const std::string& name, const AnyRef& actor);
  /// A reference to the actor published as NAME at `uri`
  /// ("tcp://host:port/NAME" or "troupe://host:port/NAME"). Messages to it
  /// must be declared with TROUPE_MESSAGE. Blocks up to `timeout`.
  Result<AnyRef> resolve_any(const std::string& uri, std::chrono::milliseconds timeout = kDefaultTimeout);
  /// Where an actor is reachable from other processes: its node's address
  /// and its id there (what a ref carries in a message). For keeping refs
  /// outside messages, in a directory; a local actor needs this runtime to
  /// listen.
  Result<std::pair<std::string, uint64_t>> locate(const AnyRef& actor);
  /// The ref to what locate() gave (a proxy, or the local actor itself).
  Result<AnyRef> ref_at(const std::string& address, uint64_t id);
  /// Registers `size` bytes at `data` for reads and writes by other
  /// processes through the registration's handle (see remote_buffer.h).
  /// The memory must outlive the registration.
  Result<BufferRegistration> register_buffer(void* data, size_t size);
  /// Allocates `size` bytes that other processes read and write through
  /// the registration's handle; data() is where they are, freed with the
  /// registration. Over UCX the memory is shared memory that a peer on the
  /// same host maps, so its reads are plain copies (faster than reads of
  /// register_buffer's memory, which go through the kernel there; see
  /// docs/transports.md). Use it for buffers made to be read remotely.
  Result<BufferRegistration> allocate_buffer(size_t size);
  /// Like resolve_any(), typed. The remote actor's class is not checked: a
  /// message it does not handle fails with unknown_message.
  template <class A>
  Result<ActorRef<A>> resolve(const std::string& uri, std::chrono::milliseconds timeout = kDefaultTimeout) {
    auto any = resolve_any(uri, timeout);
    if (!any) return error(any.error());
    return ActorRef<A>(detail::CellPtr(any->cell()));
  }

  /// Stops every supervision tree (reverse start order, each stopping its
  /// children in reverse order), then every other actor, then the
  /// scheduler. Idempotent; the destructor calls it.
  Status shutdown();

  /// The configuration in force (threads resolved).
  const RuntimeConfig& config() const;

 private:
  friend detail::CellPtr detail::spawn_from_spec(Runtime& rt, detail::SpawnSpec spec);
  friend detail::CellPtr detail::spawn_from_spec(Runtime& rt, detail::SpawnSpec spec,
                                                 std::function<void(Status)> started);
  std::unique_ptr<detail::RuntimeImpl> impl_;
};

}  // namespace troupe
