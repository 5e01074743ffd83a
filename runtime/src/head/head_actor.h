// The head's one actor: membership (nodes register, beat, die), the resource
// ledger and placement-group scheduler, and the durable record of both. All
// state changes go to the store before they are answered, so a head killed
// and started again on the same data directory picks up where it was.
#pragma once

#include <chrono>
#include <deque>
#include <set>
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

/// "prefix-<16 random hex digits>": ids of groups, jobs, actors, workers.
std::string random_id(const char* prefix);

class HeadActor : public Actor<HeadActor, RegisterNode, NodeHeartbeat, CreatePlacementGroup, WaitPlacementGroup,
                               RemovePlacementGroup, GetClusterStatus, SubmitJob, GetJob, ReadJobLog, StopJob,
                               JobEnded, RegisterName, LookupName, UnregisterName, SpawnActor, GetActor, ListActors,
                               KillActor, WorkerExited, ActorExited, SaveSnapshot, LeaveNode, WatchActors> {
 public:
  HeadActor(std::shared_ptr<Store> store, HeadConfig config);

  void on_start() override;

  Result<Registered> handle(const RegisterNode& m);
  Result<bool> handle(const NodeHeartbeat& m);  // false: unknown or declared dead, register again
  void handle(const LeaveNode& m);
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
  Deferred<NamedActor> handle(const LookupName& m);
  Result<void> handle(const UnregisterName& m);

  // Actors on the cluster (head_actors.cc).
  Deferred<ActorInfo> handle(const SpawnActor& m);
  Deferred<ActorInfo> handle(const GetActor& m);
  std::vector<ActorInfo> handle(const ListActors& m);
  Result<void> handle(const KillActor& m);
  void handle(const WorkerExited& m);
  void handle(const ActorExited& m);
  void handle(const SaveSnapshot& m);
  Result<void> handle(const WatchActors& m);

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
  /// `left`: it said goodbye (logged as such, not as a failure).
  void node_dead(const std::string& id, const std::string& why, bool left = false);
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
    /// Set for an actor the cluster created (its location follows its
    /// restarts); empty for a driver's actor registered by name.
    std::string actor_id;
  };
  std::map<std::string, Named> names_;  // "ns/name"
  size_t next_job_node_ = 0;

  // -- actors on the cluster (head_actors.cc) --------------------------------
  /// Someone waiting for an actor to be alive (or dead: status set).
  struct ActorWaiter {
    std::function<void(const ActorInfo&, const Status&)> fn;
    std::chrono::steady_clock::time_point deadline;
    /// At the deadline, an actor still alive (where the asker thought it
    /// gone) is the answer: its connection may have failed, not it.
    bool alive_at_deadline_ok = false;
  };
  struct ClusterActor {
    ActorRecord rec;
    /// Where its own resources are held (not inside a bundle), or kNoNode.
    NodeIndex holds_on = kNoNode;
    /// The bundle whose resources it uses, or -1.
    int in_bundle = -1;
    /// Bumped by every creation attempt: a late answer to an older one is
    /// recognised and ignored.
    uint64_t attempt = 0;
    /// Restarts in a row whose constructor threw: each waits longer before
    /// the next (an actor that cannot start again does not spin).
    uint32_t failed_starts = 0;
    std::vector<ActorWaiter> waiters;
    /// Told an ActorEvent at each failure, return and death.
    std::vector<AnyRef> watchers;
  };
  struct Worker {
    WorkerRecord rec;
    bool ready = false;
    AnyRef ref;
    MonitorId monitor = 0;
    /// Actors waiting for it to start, and those it hosts.
    std::vector<std::string> queued;
    std::set<std::string> hosted;
  };
  struct Owner {
    MonitorId monitor = 0;
    std::set<std::string> actors;
  };

  void load_actors();
  /// Finds it a node and a worker there and creates it; or leaves it
  /// pending (with the reason) until resources change.
  void schedule_actor(const std::string& id);
  /// Tries the pending actors again (after groups, which go first).
  void place_pending_actors();
  /// The node for an actor, reserving its resources; kNoNode (and why).
  NodeIndex place_actor(ClusterActor& a, std::string* why, bool* hopeless);
  void release_actor_resources(ClusterActor& a);
  /// The actor no longer runs in that worker; a dedicated worker left
  /// empty is stopped.
  void leave_worker(const std::string& worker_id, const std::string& actor_id);
  Worker* worker_for(const std::string& node, const ClusterActor& a);
  /// GPUs the actor's dedicated process is for: its bundle's (a specific
  /// bundle of a placement group) or its own resources'.
  double gpu_demand(const ClusterActor& a) const;
  /// Gives a new dedicated worker GPU indices of its node for `gpus`:
  /// whole free GPUs for 1 or more, a share of one for less (packing
  /// shares). False, with nothing taken, when the node's GPUs are too
  /// fragmented (the worker then sees all of them).
  bool take_gpus(Worker& w, double gpus);
  /// Gives a worker's GPU indices back.
  void give_back_gpus(const Worker& w);
  void start_worker(Worker& w);
  void create_on(Worker& w, const std::string& actor_id);
  void actor_alive(ClusterActor& a, const std::string& worker, const Location& where);
  /// Its incarnation ended abnormally: restart it if its options allow.
  /// `delay`: how long the restart waits (a restart whose start failed).
  void actor_failed(const std::string& id, const std::string& why,
                    std::chrono::milliseconds delay = std::chrono::milliseconds(0));
  /// It ends for good (stopped, killed, restarts used up, owner gone).
  void actor_dead(const std::string& id, const std::string& why, bool stop_it);
  void worker_dead(const std::string& worker_id, const std::string& why);
  void watch_worker(Worker& w);
  void watch_owner(const ClusterActor& a);
  Status persist_actor(const ClusterActor& a);
  /// Applies changes to the store, or adds them to the batch in progress.
  Status write(std::vector<Store::Change> changes);
  void answer_waiters(ClusterActor& a, const Status& status);
  void tell_watchers(const ClusterActor& a);
  void expire_actor_waiters(std::chrono::steady_clock::time_point now);
  /// Stops the actors of a placement group being removed.
  void stop_group_actors(const std::string& group);

  std::map<std::string, ClusterActor> actors_;
  std::vector<std::string> pending_actors_;
  std::map<std::string, std::string> actor_requests_;  // request id -> actor id
  std::deque<ActorInfo> dead_actors_;                  // the last ones, for troupe list actors
  std::map<std::string, Worker> workers_;
  std::map<std::pair<std::string, std::string>, std::string> shared_workers_;  // (node, program) -> worker id
  std::map<std::pair<std::string, int>, ResourceMap> bundle_used_;             // (group, bundle) -> in use
  std::map<std::string, std::vector<double>> gpu_use_;  // node -> the share of each of its GPUs held by workers
  std::map<std::pair<std::string, uint64_t>, Owner> owners_;                   // owner location -> its actors
  size_t next_actor_node_ = 0;
  /// While set, writes gather here and commit together (worker_dead).
  std::vector<Store::Change>* batch_ = nullptr;
};

}  // namespace troupe::cluster
