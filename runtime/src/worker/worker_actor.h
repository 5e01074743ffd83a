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

#include "cluster/protocol.h"
#include "troupe/actor.h"
#include "troupe/runtime.h"

namespace troupe::cluster {

class WorkerActor final : public Actor<WorkerActor, CreateActor, StopActor, AdoptWorker> {
 public:
  /// `done` runs once when the worker should end (its agent is gone).
  WorkerActor(Runtime* rt, std::string worker_id, AnyRef agent, std::function<void()> done);

  void on_start() override;
  Result<Location> handle(const CreateActor& m);
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
  };
  std::map<std::string, Hosted> actors_;  // cluster actor id -> its incarnation here
};

}  // namespace troupe::cluster
