// The head's one actor: membership (nodes register, beat, die), the resource
// ledger and placement-group scheduler, and the durable record of both. All
// state changes go to the store before they are answered, so a head killed
// and started again on the same data directory picks up where it was.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cluster/protocol.h"
#include "head/store.h"
#include "placement/ledger.h"
#include "troupe/actor.h"

namespace troupe::cluster {

struct HeadConfig {
  /// How often agents beat.
  std::chrono::milliseconds heartbeat{250};
  /// A node silent this long is dead (kill -9 of its agent is noticed at
  /// once through the lost connection; this bound covers hangs and network
  /// partitions).
  std::chrono::milliseconds dead_after{2000};
  /// The head's own address, for status.
  std::string address;
  /// Turns a directory entry's location into a ref (Runtime::ref_at).
  std::function<Result<AnyRef>(const std::string& address, uint64_t id)> ref_at;
};

class HeadActor : public Actor<HeadActor, RegisterNode, NodeHeartbeat, CreatePlacementGroup, WaitPlacementGroup,
                               RemovePlacementGroup, GetClusterStatus, SubmitJob, GetJob, ReadJobLog, StopJob,
                               JobEnded, RegisterName, LookupName, UnregisterName> {
 public:
  HeadActor(std::shared_ptr<Store> store, HeadConfig config);

  void on_start() override;

  Result<Registered> handle(const RegisterNode& m);
  Result<bool> handle(const NodeHeartbeat& m);  // false: unknown or declared dead, register again
  Result<std::string> handle(const CreatePlacementGroup& m);
  Deferred<PlacementGroupInfo> handle(const WaitPlacementGroup& m);
  Result<void> handle(const RemovePlacementGroup& m);
  ClusterStatus handle(const GetClusterStatus& m);
  Deferred<std::string> handle(const SubmitJob& m);
  Result<JobInfo> handle(const GetJob& m);
  Deferred<std::string> handle(const ReadJobLog& m);
  Deferred<void> handle(const StopJob& m);
  void handle(const JobEnded& m);
  Result<NamedActor> handle(const RegisterName& m);
  Result<NamedActor> handle(const LookupName& m);
  Result<void> handle(const UnregisterName& m);

 private:
  struct Node {
    NodeInfo info;
    NodeIndex index = kNoNode;
    std::chrono::steady_clock::time_point last_heard;
    AnyRef agent;
    MonitorId monitor = 0;
  };
  struct Waiter {
    Deferred<PlacementGroupInfo> reply;
    std::chrono::steady_clock::time_point deadline;
  };
  struct Group {
    PlacementGroupInfo info;
    std::vector<Waiter> waiters;
  };

  void tick();
  void node_dead(const std::string& id, const std::string& why);
  /// Tries the groups that wait, rescheduled ones first; persists and
  /// answers waiters of those that got placed.
  void place_pending();
  void placed(Group& g, const std::vector<NodeIndex>& nodes);
  Status persist_node(const Node& n);
  Status persist_group(const Group& g);
  void load();
  std::string new_group_id();
  /// The alive node that runs a job: `wanted`, or the next one in turn.
  Node* node_for_job(const std::string& wanted, std::string* why);
  Status persist_job(const JobInfo& j);
  /// Adds a name (watching its actor); false when its actor is unreachable.
  Status add_name(const NamedActor& entry);

  std::shared_ptr<Store> store_;
  HeadConfig config_;
  Ledger ledger_;
  std::map<std::string, Node> nodes_;
  std::map<std::string, Group> groups_;
  std::map<std::string, std::string> group_names_;  // name -> id
  std::map<std::string, std::string> group_requests_;  // request id -> group id
  /// Groups that wait for resources, oldest first; rescheduled ones go to
  /// the front (Ray reschedules lost bundles before placing new groups).
  std::vector<std::string> pending_;
  std::map<std::string, JobInfo> jobs_;
  struct Named {
    NamedActor entry;
    MonitorId monitor = 0;
  };
  std::map<std::string, Named> names_;  // "ns/name"
  size_t next_job_node_ = 0;
};

}  // namespace troupe::cluster
