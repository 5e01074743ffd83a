// Messages between drivers, node agents and the head. Names are qualified
// ("troupe.…") so that they never clash with a user's message types.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "troupe/actor_ref.h"
#include "troupe/cluster.h"
#include "troupe/message.h"
#include "troupe/placement.h"

namespace troupe::cluster {

/// The name the head publishes its actor under, and the agent's.
inline constexpr const char* kHeadName = "troupe.head";
inline constexpr const char* kAgentName = "troupe.agent";

/// The environment a node agent starts a worker process with: its id, where
/// its agent is, and where it should listen.
inline constexpr const char* kWorkerIdEnv = "TROUPE_WORKER_ID";
inline constexpr const char* kWorkerAgentEnv = "TROUPE_WORKER_AGENT";
inline constexpr const char* kWorkerListenEnv = "TROUPE_WORKER_LISTEN";

/// Agent -> head: this node joins (or comes back after a head restart).
struct RegisterNode {
  std::string node_id;
  std::string address;
  ResourceMap resources;
  Labels labels;
  AnyRef agent;  // watched: its process dying marks the node dead at once
  TROUPE_MESSAGE_NAMED(RegisterNode, "troupe.RegisterNode", node_id, address, resources, labels, agent);
};
/// Head -> agent, answering RegisterNode: how often to beat.
struct Registered {
  int64_t heartbeat_ms = 0;
  TROUPE_MESSAGE_NAMED(Registered, "troupe.Registered", heartbeat_ms);
};
/// Agent -> head, every heartbeat period; the answer false means "register
/// again" (the head restarted without it, or declared it dead).
struct NodeHeartbeat {
  std::string node_id;
  TROUPE_MESSAGE_NAMED(NodeHeartbeat, "troupe.NodeHeartbeat", node_id);
};

/// Agent -> head, when it stops gracefully: the node leaves (its workers
/// and jobs stop with it).
struct LeaveNode {
  std::string node_id;
  TROUPE_MESSAGE_NAMED(LeaveNode, "troupe.LeaveNode", node_id);
};

/// Anyone -> agent: which node is this?
struct GetNodeId {
  TROUPE_MESSAGE_NAMED(GetNodeId, "troupe.GetNodeId");
};

/// Driver -> head.
struct CreatePlacementGroup {
  PlacementGroupSpec spec;
  /// Chosen by the client; a retried request with the same key gets the
  /// group the first one made.
  std::string request_id;
  TROUPE_MESSAGE_NAMED(CreatePlacementGroup, "troupe.CreatePlacementGroup", spec, request_id);
};
struct WaitPlacementGroup {
  std::string id;
  int64_t timeout_ms = 0;
  TROUPE_MESSAGE_NAMED(WaitPlacementGroup, "troupe.WaitPlacementGroup", id, timeout_ms);
};
struct RemovePlacementGroup {
  std::string id;
  TROUPE_MESSAGE_NAMED(RemovePlacementGroup, "troupe.RemovePlacementGroup", id);
};
struct GetClusterStatus {
  TROUPE_MESSAGE_NAMED(GetClusterStatus, "troupe.GetClusterStatus");
};

/// The directory of named actors.
struct RegisterName {
  NamedActor entry;
  TROUPE_MESSAGE_NAMED(RegisterName, "troupe.RegisterName", entry);
};
struct LookupName {
  std::string ns;
  std::string name;
  TROUPE_MESSAGE_NAMED(LookupName, "troupe.LookupName", ns, name);
};
struct UnregisterName {
  std::string ns;
  std::string name;
  TROUPE_MESSAGE_NAMED(UnregisterName, "troupe.UnregisterName", ns, name);
};

/// Jobs. Driver -> head -> agent, and the agent's report back.
struct SubmitJob {
  std::vector<std::string> command;
  std::string node;
  std::vector<std::string> env;  // "K=V"
  TROUPE_MESSAGE_NAMED(SubmitJob, "troupe.SubmitJob", command, node, env);
};
struct GetJob {
  std::string id;
  TROUPE_MESSAGE_NAMED(GetJob, "troupe.GetJob", id);
};
struct ReadJobLog {
  std::string id;
  uint64_t offset = 0;
  uint64_t max_bytes = 0;
  TROUPE_MESSAGE_NAMED(ReadJobLog, "troupe.ReadJobLog", id, offset, max_bytes);
};
struct StopJob {
  std::string id;
  TROUPE_MESSAGE_NAMED(StopJob, "troupe.StopJob", id);
};
/// Head -> agent: start it (the answer comes once it runs).
struct RunJob {
  std::string id;
  std::vector<std::string> command;
  std::vector<std::string> env;
  AnyRef report_to;  // gets JobEnded
  TROUPE_MESSAGE_NAMED(RunJob, "troupe.RunJob", id, command, env, report_to);
};
/// Agent -> head: it ended.
struct JobEnded {
  std::string id;
  int exit_code = 0;
  bool stopped = false;
  TROUPE_MESSAGE_NAMED(JobEnded, "troupe.JobEnded", id, exit_code, stopped);
};

/// Where an actor's incarnation (or a worker's actor) is: Runtime::ref_at.
struct Location {
  std::string address;
  uint64_t id = 0;
  TROUPE_FIELDS(address, id);
};

/// Actors on the cluster. What the head keeps to create (and re-create) one.
struct ActorSpec {
  /// The registered class (detail::ActorClass::key) and its encoded
  /// constructor arguments.
  std::string class_key;
  std::string args;
  /// The program that has the class: workers run it.
  std::string executable;
  ActorOptions options;
  /// The driver that owns it (not detached): where its owner actor is.
  std::string owner_address;
  uint64_t owner_id = 0;
  TROUPE_FIELDS(class_key, args, executable, options, owner_address, owner_id);
};
/// The head's durable record of one actor.
struct ActorRecord {
  ActorInfo info;
  ActorSpec spec;
  TROUPE_FIELDS(info, spec);
};

/// Driver -> head: create it (or, for a name that is taken, return the
/// holder); answered once it is alive, or with why not by `timeout_ms`.
struct SpawnActor {
  ActorSpec spec;
  std::string request_id;
  int64_t timeout_ms = 0;
  TROUPE_MESSAGE_NAMED(SpawnActor, "troupe.SpawnActor", spec, request_id, timeout_ms);
};
/// Driver -> head: an actor by id, or by name when `id` is empty; with
/// `wait_alive_ms` > 0 the answer waits (that long at most) until it is alive.
struct GetActor {
  std::string id;
  std::string ns;
  std::string name;
  int64_t wait_alive_ms = 0;
  /// An incarnation the asker knows is gone (the head may not know yet):
  /// wait for another one.
  Location not_at;
  TROUPE_MESSAGE_NAMED(GetActor, "troupe.GetActor", id, ns, name, wait_alive_ms, not_at);
};
struct ListActors {
  TROUPE_MESSAGE_NAMED(ListActors, "troupe.ListActors");
};
/// Driver -> head: tell `watcher` an ActorEvent whenever one of these actors
/// fails, comes back or dies (until it is dead). Not kept across a head
/// restart.
struct WatchActors {
  std::vector<std::string> ids;
  AnyRef watcher;
  TROUPE_MESSAGE_NAMED(WatchActors, "troupe.WatchActors", ids, watcher);
};

/// Driver -> head: stop it for good (no restart).
struct KillActor {
  std::string id;
  TROUPE_MESSAGE_NAMED(KillActor, "troupe.KillActor", id);
};


/// Head -> agent: start a worker process running `executable`; answered
/// with the worker actor's location once the worker reports ready.
struct StartWorker {
  std::string worker_id;
  std::string executable;
  /// The node's GPUs (0..GPU-1, as the node counts them) reserved for this
  /// process, when `limit_gpus`: the agent narrows the process's
  /// CUDA_VISIBLE_DEVICES to them (through its own, if it has one).
  bool limit_gpus = false;
  std::vector<uint32_t> gpus;
  TROUPE_MESSAGE_NAMED(StartWorker, "troupe.StartWorker", worker_id, executable, limit_gpus, gpus);
};
struct WorkerStarted {
  Location where;
  int64_t pid = 0;
  TROUPE_MESSAGE_NAMED(WorkerStarted, "troupe.WorkerStarted", where, pid);
};
/// Worker -> its agent, once it serves.
struct WorkerReady {
  std::string worker_id;
  AnyRef worker;
  Location where;  // the worker actor's location, for the head
  TROUPE_MESSAGE_NAMED(WorkerReady, "troupe.WorkerReady", worker_id, worker, where);
};
/// Agent -> head: a worker process ended (waitpid status).
struct WorkerExited {
  std::string node_id;
  std::string worker_id;
  int status = 0;
  TROUPE_MESSAGE_NAMED(WorkerExited, "troupe.WorkerExited", node_id, worker_id, status);
};
/// Head -> agent: stop a worker (SIGTERM, SIGKILL after 5 s).
struct StopWorker {
  std::string worker_id;
  TROUPE_MESSAGE_NAMED(StopWorker, "troupe.StopWorker", worker_id);
};

/// Head -> worker: create an incarnation of an actor; answered with where.
struct CreateActor {
  std::string actor_id;
  std::string class_key;
  std::string args;
  uint64_t mailbox_bound = 0;
  uint32_t snapshot_every = 0;
  /// The last snapshot, for restore().
  std::optional<std::string> snapshot;
  /// Where snapshots and exits go.
  AnyRef head;
  TROUPE_MESSAGE_NAMED(CreateActor, "troupe.CreateActor", actor_id, class_key, args, mailbox_bound, snapshot_every,
                       snapshot, head);
};
/// Head -> worker: stop an actor.
struct StopActor {
  std::string actor_id;
  TROUPE_MESSAGE_NAMED(StopActor, "troupe.StopActor", actor_id);
};
/// Worker -> head: an incarnation ended (`crashed`: abnormally).
struct ActorExited {
  std::string actor_id;
  Location where;
  bool crashed = false;
  std::string reason;
  TROUPE_MESSAGE_NAMED(ActorExited, "troupe.ActorExited", actor_id, where, crashed, reason);
};
/// Worker -> head: an actor's latest snapshot.
struct SaveSnapshot {
  std::string actor_id;
  std::string bytes;
  TROUPE_MESSAGE_NAMED(SaveSnapshot, "troupe.SaveSnapshot", actor_id, bytes);
};
/// Head -> worker, after a head restart: report to this head from now on.
/// Answered with the latest snapshot of each actor the worker hosts (those
/// taken while no head was there to keep them included).
struct Snapshots {
  std::map<std::string, std::string> latest;  // actor id -> bytes
  std::vector<std::string> hosted;            // every actor it hosts
  TROUPE_MESSAGE_NAMED(Snapshots, "troupe.Snapshots", latest, hosted);
};
struct AdoptWorker {
  AnyRef head;
  TROUPE_MESSAGE_NAMED(AdoptWorker, "troupe.AdoptWorker", head);
};
/// The head's durable record of a worker process.
struct WorkerRecord {
  std::string id;
  std::string node;
  std::string executable;
  bool dedicated = false;
  Location where;
  /// GPU indices of its node it holds (dedicated workers whose actor asks
  /// for GPUs), each a `gpu_share` of that GPU (1: whole).
  std::vector<uint32_t> gpus;
  double gpu_share = 0;
  TROUPE_FIELDS(id, node, executable, dedicated, where, gpus, gpu_share);
};

}  // namespace troupe::cluster
