// The actor a worker process serves with: it builds the actors the head asks
// for from their class name and encoded arguments, forwards their snapshots
// to the head (kept there so that a restart on another node has them), and
// reports each one's end.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cluster/protocol.h"
#include "troupe/actor.h"
#include "troupe/runtime.h"

namespace troupe::cluster {

/// A hosted actor's first start succeeded (sent by the worker to itself
/// from the actor's start; internal). A failed start shows as its end.
struct HostedStarted {
  std::string actor_id;
  uint64_t ref_id = 0;
  TROUPE_MESSAGE_NAMED(HostedStarted, "troupe.worker.HostedStarted", actor_id, ref_id);
};

class WorkerActor final : public Actor<WorkerActor, CreateActor, StopActor, AdoptWorker, HostedStarted> {
 public:
  /// `done` runs once when the worker should end (its agent is gone).
  WorkerActor(Runtime* rt, std::string worker_id, AnyRef agent, std::function<void()> done);

  void on_start() override;
  /// Answers once the actor has started (its constructor and on_start ran):
  /// with where it is, or start_failed with why (the head then records it
  /// dead rather than restarting it into the same failure).
  Deferred<Location> handle(const CreateActor& m);
  void handle(const HostedStarted& m);
  void handle(const StopActor& m);
  Snapshots handle(const AdoptWorker& m);

 private:
  /// The head to report to; replaced after a head restart (AdoptWorker).
  /// Shared with the actors' snapshot hooks, which run on their threads.
  struct HeadBox {
    std::mutex mu;
    AnyRef head;
    /// Each hosted actor's latest snapshot, for a head that restarts.
    std::map<std::string, std::string> latest;
    AnyRef get() {
      std::lock_guard<std::mutex> lock(mu);
      return head;
    }
  };

  Runtime* rt_;
  std::string worker_id_;
  AnyRef agent_;
  std::function<void()> done_;
  std::shared_ptr<HeadBox> head_ = std::make_shared<HeadBox>();
  struct Hosted {
    AnyRef ref;
    Location where;
    /// Until its first start ends: the creation's answers to give.
    bool started = false;
    std::vector<Deferred<Location>> waiting;
  };
  // Answers the creations waiting on `h` and forgets it when its start failed.
  void start_ended(const std::string& id, Hosted& h, const Status& outcome);
  std::map<std::string, Hosted> actors_;  // cluster actor id -> its incarnation here
};

}  // namespace troupe::cluster
