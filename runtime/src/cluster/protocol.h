// Messages between drivers, node agents and the head. Names are qualified
// ("troupe.…") so that they never clash with a user's message types.
#pragma once

#include <cstdint>
#include <string>

#include "troupe/actor_ref.h"
#include "troupe/cluster.h"
#include "troupe/message.h"
#include "troupe/placement.h"

namespace troupe::cluster {

/// The name the head publishes its actor under, and the agent's.
inline constexpr const char* kHeadName = "troupe.head";
inline constexpr const char* kAgentName = "troupe.agent";

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

}  // namespace troupe::cluster
