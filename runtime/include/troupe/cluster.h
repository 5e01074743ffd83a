// The cluster, seen from a driver: connect to a head (`troupe start --head`),
// look at its nodes, reserve placement groups.
//
//   troupe::Runtime rt({.transport = "tcp"});
//   auto cluster = troupe::ClusterClient::connect(rt, "tcp://10.0.0.1:6380").value();
//   auto pg = cluster.create_placement_group({.strategy = troupe::PlacementStrategy::strict_spread,
//                                             .bundles = {{{{"GPU", 1}}}, {{{"GPU", 1}}}}}).value();
//   cluster.wait_placement_group(pg, 10s);   // Ray's pg.ready()
//
// See docs/cluster.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "troupe/actor_ref.h"
#include "troupe/codec.h"
#include "troupe/detail/actor_class.h"
#include "troupe/future.h"
#include "troupe/message.h"
#include "troupe/placement.h"
#include "troupe/runtime.h"
#include "troupe/status.h"

namespace troupe {

/// A node as the head sees it.
struct NodeInfo {
  std::string id;
  /// The node agent's address.
  std::string address;
  ResourceMap total;
  ResourceMap free;
  Labels labels;
  /// "alive" or "dead".
  std::string state;
  /// Milliseconds since the head last heard from it.
  int64_t silent_ms = 0;
  /// Its agent has registered with this head process (false for a node the
  /// head restored from its data directory until the agent finds it again).
  bool connected = false;

  TROUPE_FIELDS(id, address, total, free, labels, state, silent_ms, connected);
};

/// A placement group as the head sees it.
struct PlacementGroupInfo {
  std::string id;
  PlacementGroupSpec spec;
  /// "pending", "created" (all bundles reserved), "rescheduling" (a node
  /// with some of its bundles died) or "removed".
  std::string state;
  /// Why it is not created yet, when it is not.
  std::string reason;
  /// Per bundle, the id of its node ("" while not placed).
  std::vector<std::string> bundle_nodes;
  /// The creating request's key (see ClusterClient), for retries.
  std::string request_id;

  TROUPE_FIELDS(id, spec, state, reason, bundle_nodes, request_id);
};

/// A job: a command the cluster runs on one of its nodes (`troupe job`).
struct JobInfo {
  std::string id;
  std::vector<std::string> command;
  std::string node;
  /// "running", "succeeded", "failed" or "stopped".
  std::string state;
  /// The exit code, or -signal when a signal ended it.
  int exit_code = 0;
  /// Why it failed, when the cluster knows more than the exit code.
  std::string message;
  /// Wall-clock times, milliseconds since the epoch (0 while not ended).
  int64_t submitted_ms = 0;
  int64_t ended_ms = 0;

  TROUPE_FIELDS(id, command, node, state, exit_code, message, submitted_ms, ended_ms);
};

/// An entry of the head's directory of named actors.
struct NamedActor {
  std::string ns;
  std::string name;
  /// Where the actor is (Runtime::locate).
  std::string address;
  uint64_t id = 0;

  TROUPE_FIELDS(ns, name, address, id);
};

/// How an actor is placed and kept on a cluster (ClusterClient::spawn).
struct ActorOptions {
  /// A name in namespace `ns`: get-or-create (spawning a name that a running
  /// actor holds returns that actor); the name is freed when it stops for
  /// good. Empty: anonymous.
  std::string name{};
  std::string ns = "default";
  /// What it holds while it exists ({"CPU", 1}, {"GPU", 1}, custom names).
  /// None by default: it may go to any node (Ray's actors hold 0 CPU once
  /// placed, too).
  ResourceMap resources{};
  /// Run inside this placement group (its id), in bundle `bundle` (-1: the
  /// first bundle with room); the resources come out of the bundle's.
  std::string placement_group{};
  int bundle = -1;
  /// Only on nodes whose labels match ("rack=r1", see placement.h).
  LabelSelector label_selector{};
  /// Restarts after a crash or the loss of its process or node, with the
  /// state of its last snapshot: 0 none, -1 without limit.
  int max_restarts = 0;
  /// Asks that were in flight to an incarnation that died (before it
  /// answered) are sent again to the next one, up to this many times each,
  /// in the order they were first sent: at-least-once for those. 0 (the
  /// default, like Ray): at most once, they fail with peer_lost.
  uint32_t max_task_retries = 0;
  /// Detached actors live until stopped (or their group is removed); the
  /// others stop when the driver that spawned them (its runtime) goes.
  bool detached = false;
  /// Take a snapshot after every N messages (0: at checkpoint() and graceful
  /// stops only). Snapshots are kept by the head, so a restart on another
  /// node starts from the last one.
  uint32_t snapshot_every = 0;
  /// Mailbox bound (0: the worker's default).
  uint64_t mailbox_bound = 0;
  /// A worker process of its own instead of the node's shared worker for
  /// this program (crash isolation, at the price of a process start).
  bool dedicated_process = false;
  /// Run in the same process as the actor with this id (a mesh's process
  /// anchor): it goes where that one goes, and waits while that one restarts.
  std::string colocate_with{};
  /// Start from the last snapshot of this (dead) actor: a supervisor's
  /// restart of a remote child carries the child's state this way. The head
  /// keeps the snapshots of the last 1,000 dead actors (not across its own
  /// restart).
  std::string restore_from{};

  TROUPE_FIELDS(name, ns, resources, placement_group, bundle, label_selector, max_restarts, max_task_retries,
                detached, snapshot_every, mailbox_bound, dedicated_process, colocate_with, restore_from);
};

/// An actor of the cluster as the head sees it.
struct ActorInfo {
  /// The cluster's id for it, stable across restarts.
  std::string id;
  /// Its C++ class and constructor argument types.
  std::string class_name;
  /// "pending" (waiting for a place: see reason), "starting", "alive",
  /// "restarting" or "dead" (see reason).
  std::string state;
  std::string reason;
  /// Where its current incarnation runs: node, worker process, and the
  /// location a ref is made from (Runtime::ref_at).
  std::string node;
  std::string worker;
  std::string address;
  uint64_t ref_id = 0;
  /// Restarts so far.
  uint32_t restarts = 0;
  ActorOptions options;

  TROUPE_FIELDS(id, class_name, state, reason, node, worker, address, ref_id, restarts, options);
};

/// A change in the life of an actor of the cluster (ClusterClient::watch).
struct ActorEvent {
  std::string id;
  /// "restarting" (it failed and will come back), "alive" (it is back) or
  /// "dead" (for good).
  std::string state;
  std::string reason;
  uint32_t restarts = 0;
  TROUPE_MESSAGE_NAMED(ActorEvent, "troupe.ActorEvent", id, state, reason, restarts);
};

/// What `troupe status` shows.
struct ClusterStatus {
  std::string head_address;
  std::vector<NodeInfo> nodes;
  std::vector<PlacementGroupInfo> placement_groups;
  std::vector<JobInfo> jobs;
  std::vector<NamedActor> named_actors;
  /// How many actors are in each state ("alive", "pending", ...).
  std::map<std::string, int64_t> actors_by_state;
  /// The actors that are not alive (waiting for a place, restarting, the
  /// last dead ones), with their reasons; every actor: list_actors().
  std::vector<ActorInfo> actors;

  TROUPE_FIELDS(head_address, nodes, placement_groups, jobs, named_actors, actors_by_state, actors);
};

/// A driver's handle on a running cluster. Cheap to copy; the Runtime it
/// was connected through must outlive it.
///
/// While the head is down (killed, restarting), the synchronous calls wait
/// for it, reconnecting, up to their timeout, and then fail with peer_lost;
/// creating a placement group is safe to repeat this way (the head
/// recognises a retried request). submit_job is retried only when the
/// request cannot have reached a head (a job never runs twice). The *_async
/// calls make one attempt.
class ClusterClient {
 public:
  /// Connects through `rt` to the head at `head_address` ("tcp://host:port",
  /// "ucx://host:port" or "host:port"). Fails with a clear error when nothing
  /// answers there.
  static Result<ClusterClient> connect(Runtime& rt, const std::string& head_address,
                                       std::chrono::milliseconds timeout = std::chrono::seconds(10));

  /// The cluster's nodes and placement groups.
  Result<ClusterStatus> status(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

  /// Reserves a placement group; returns its id at once (the group may be
  /// pending: see wait_placement_group). Fails for an invalid spec or a name
  /// already taken.
  Result<std::string> create_placement_group(const PlacementGroupSpec& spec,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  /// Waits until the group is created (all bundles reserved): Ray's ready().
  /// On timeout the error carries the reason it is still pending.
  Result<PlacementGroupInfo> wait_placement_group(const std::string& id, std::chrono::milliseconds timeout) const;
  /// Frees the group's resources (and, with actors, stops its actors).
  Status remove_placement_group(const std::string& id,
                                std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

  /// The same three without waiting: many requests in flight at once (as
  /// Ray's placement_group() returns before the group exists).
  Future<std::string> create_placement_group_async(const PlacementGroupSpec& spec,
                                                   std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  Future<PlacementGroupInfo> wait_placement_group_async(const std::string& id, std::chrono::milliseconds timeout) const;
  Future<void> remove_placement_group_async(const std::string& id,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

  /// Runs `command` (argv) on a node (`node`, or any alive one) with `env`
  /// added to its environment; returns the job id once it has started.
  Result<std::string> submit_job(const std::vector<std::string>& command, const std::string& node = "",
                                 const std::vector<std::string>& env = {},
                                 std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  /// A job's state.
  Result<JobInfo> job(const std::string& id, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  /// Up to `max_bytes` of a job's output (stdout and stderr) from `offset`.
  Result<std::string> job_logs(const std::string& id, uint64_t offset = 0, uint64_t max_bytes = 1 << 20,
                               std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  /// Stops a job: SIGTERM to its process group, SIGKILL after 5 s.
  Status stop_job(const std::string& id, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

  /// Names `actor` `name` in namespace `ns` unless a running actor holds the
  /// name already, and returns the holder: get-or-create, so that of many
  /// callers racing for a name the first wins and all get the same actor.
  /// A named actor leaves the directory when it stops (or its process
  /// dies); the directory survives a head restart. The actor's runtime must
  /// listen (RuntimeConfig::listen).
  Result<AnyRef> register_name(const AnyRef& actor, const std::string& name, const std::string& ns = "default",
                               std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  /// The actor named `name` in `ns` (not_found when there is none).
  Result<AnyRef> get_actor(const std::string& name, const std::string& ns = "default",
                           std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  /// Typed: the remote actor's class is not checked (like Runtime::resolve).
  template <class A>
  Result<ActorRef<A>> get_actor_as(const std::string& name, const std::string& ns = "default") const {
    auto any = get_actor(name, ns);
    if (!any) return error(any.error());
    return ActorRef<A>(detail::CellPtr(any->cell()));
  }
  /// Frees a name (no error when it is free already).
  Status unregister_name(const std::string& name, const std::string& ns = "default",
                         std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

  /// How long spawn() waits for an actor to be alive (it may wait for
  /// resources, a placement group, a worker process to start).
  static constexpr std::chrono::milliseconds kSpawnTimeout{60'000};

  /// Creates an actor of class A on the cluster, placed by `options`, built
  /// from `args` in a worker process (this program's executable, started by
  /// the node's agent: see troupe/worker.h), and returns a ref once it is
  /// alive. With a name, get-or-create: a running actor with that name is
  /// returned instead (then `args` are unused). The constructor arguments
  /// must be encodable (numbers, strings, containers, TROUPE_FIELDS structs).
  /// The ref follows the actor across restarts (see follow()).
  template <class A, class... Args>
  Result<ActorRef<A>> spawn(const ActorOptions& options, Args&&... args) const {
    auto info = spawn_info<A>(options, std::forward<Args>(args)...);
    if (!info) return error(info.error());
    return follow<A>(*info);
  }
  /// Like spawn(), answering with the actor's record (its id, for actor()).
  template <class A, class... Args>
  Result<ActorInfo> spawn_info(const ActorOptions& options, Args&&... args) const {
    using Class = detail::ActorClass<A, detail::wire_arg_t<Args>...>;
    (void)Class::registered;  // registers the class in every process of this program
    return spawn_encoded(Class::key(),
                         codec::encode(std::tuple<detail::wire_arg_t<Args>...>(std::forward<Args>(args)...)), options);
  }
  /// Without waiting: many spawns in flight at once (as Ray's .remote()).
  template <class A, class... Args>
  Future<ActorInfo> spawn_async(const ActorOptions& options, Args&&... args) const {
    using Class = detail::ActorClass<A, detail::wire_arg_t<Args>...>;
    (void)Class::registered;
    return spawn_encoded_async(Class::key(),
                               codec::encode(std::tuple<detail::wire_arg_t<Args>...>(std::forward<Args>(args)...)),
                               options);
  }
  /// A ref that follows the actor `info` describes across its restarts:
  /// while it restarts, messages wait for the new incarnation (bounded);
  /// asks in flight when one died are retried per max_task_retries; once it
  /// is dead for good, sends fail with the reason and monitors see it stop.
  /// Costs a lock per message over ref_to().
  template <class A>
  Result<ActorRef<A>> follow(const ActorInfo& info) const {
    auto cell = follow_cell(info);
    if (!cell) return error(cell.error());
    return ActorRef<A>(std::move(*cell));
  }
  Result<detail::CellPtr> follow_cell(const ActorInfo& info) const;
  /// A ref to the incarnation `info` describes (it does not follow restarts).
  template <class A>
  Result<ActorRef<A>> ref_to(const ActorInfo& info) const {
    auto any = ref_to_any(info);
    if (!any) return error(any.error());
    return ActorRef<A>(detail::CellPtr(any->cell()));
  }
  Result<AnyRef> ref_to_any(const ActorInfo& info) const;
  /// An actor of the cluster by id. With `wait_alive` > 0, waits up to that
  /// long for it to be alive (after a crash, while it restarts); fails with
  /// actor_dead once it is dead for good.
  Result<ActorInfo> actor(const std::string& id, std::chrono::milliseconds wait_alive = {},
                          std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  /// The same by name.
  Result<ActorInfo> actor_named(const std::string& name, const std::string& ns = "default",
                                std::chrono::milliseconds wait_alive = {},
                                std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  /// Every actor the cluster has (and the last dead ones).
  Result<std::vector<ActorInfo>> list_actors(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  /// Tells `watcher` (an actor handling ActorEvent) whenever one of `ids`
  /// fails, comes back or dies for good. The head forgets watches when it
  /// restarts.
  Status watch(const std::vector<std::string>& ids, const AnyRef& watcher,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  /// Stops an actor for good, whatever its max_restarts.
  Status kill_actor(const std::string& id, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

  /// The head's address.
  const std::string& address() const;

  struct State;
  /// Internal.
  explicit ClusterClient(std::shared_ptr<State> state) : state_(std::move(state)) {}
  /// Internal.
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  template <class R, class M>
  Result<R> call(const M& msg, std::chrono::milliseconds timeout, bool idempotent = true) const;
  Result<ActorInfo> spawn_encoded(const std::string& class_key, std::string args, const ActorOptions& options) const;
  Future<ActorInfo> spawn_encoded_async(const std::string& class_key, std::string args,
                                        const ActorOptions& options) const;

  std::shared_ptr<State> state_;
};

}  // namespace troupe
