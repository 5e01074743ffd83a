// A supervisor child on the cluster: a local actor (in the supervisor's
// process) whose incarnations each spawn the real actor on the cluster and
// crash when it ends, and whose cell relays messages to the current one.
#include "troupe/remote_child.h"

#include "cluster/client_state.h"
#include "log.h"
#include "troupe/detail/relay.h"

namespace troupe::cluster {

namespace {

struct RemoteChildAlive {};

class RemoteChild final : public Actor<RemoteChild, RemoteChildAlive> {
 public:
  RemoteChild(std::shared_ptr<ClusterClient::State> client, std::string class_key, std::string args,
              ActorOptions options, std::weak_ptr<detail::Relay> relay, std::shared_ptr<std::string> last_id)
      : client_(std::move(client)),
        class_key_(std::move(class_key)),
        args_(std::move(args)),
        options_(std::move(options)),
        relay_(std::move(relay)),
        last_id_ptr_(std::move(last_id)),
        last_id_(*last_id_ptr_) {}

  void handle(const RemoteChildAlive&) {}

 private:
  void start_async_(std::function<void(Status)> done) override {
    AnyRef head = client_->current_head();
    ActorOptions options = options_;
    // A restart starts from the state the previous incarnation last saved.
    options.restore_from = last_id_;
    SpawnActor m = spawn_request(*client_, class_key_, args_, options);
    ask<ActorInfo>(head, std::move(m), ClusterClient::kSpawnTimeout + std::chrono::seconds(5))
        .then([this, done](Result<ActorInfo> r) {
          if (!r) return done(Status(r.error().code(), "remote child: " + r.error().message()));
          auto ref = client_->rt->ref_at(r->address, r->ref_id);
          if (!ref) return done(ref.error());
          id_ = r->id;
          *last_id_ptr_ = r->id;
          if (auto relay = relay_.lock()) relay->retarget(detail::CellPtr(ref->cell()));
          std::string node = r->node;
          monitor(*ref, [this, node](const Down& d) {
            fail("its actor " + id_ + " on node " + node + " ended: " + d.reason.to_string());
          });
          done(Status());
        });
  }

  void stop_async_(const ExitReason&, std::function<void()> done) override {
    // A graceful stop of the child stops its actor on the cluster.
    if (!id_.empty()) {
      if (AnyRef head = client_->current_head()) (void)head.tell(KillActor{id_});
    }
    done();
  }

  std::shared_ptr<ClusterClient::State> client_;
  std::string class_key_;
  std::string args_;
  ActorOptions options_;
  std::weak_ptr<detail::Relay> relay_;
  /// The child's actor id of the previous incarnation (shared by the
  /// incarnations the factory makes), to restore from.
  std::shared_ptr<std::string> last_id_ptr_;
  std::string last_id_;
  std::string id_;
};

}  // namespace
}  // namespace troupe::cluster

namespace troupe::detail {

ChildSpec remote_child_spec(const ClusterClient& cluster, std::string name, const std::string& class_key,
                            std::string args, ActorOptions options) {
  options.max_restarts = 0;  // the supervisor restarts it
  options.detached = false;  // and it goes with this process
  // No resolver: the next incarnation comes from the child's restart.
  auto relay = std::make_shared<Relay>(CellPtr(), [](std::function<void(Result<CellPtr>)>) {},
                                       options.max_task_retries);
  ChildSpec c;
  c.name = name;
  c.spawn.name = std::move(name);
  std::weak_ptr<Relay> weak = relay;
  auto client = cluster.state();
  auto last_id = std::make_shared<std::string>();
  c.spawn.factory = [client, class_key, args, options, weak, last_id]() -> std::unique_ptr<ActorBase> {
    return std::make_unique<cluster::RemoteChild>(client, class_key, args, options, weak, last_id);
  };
  c.spawn.relay = std::move(relay);
  return c;
}

}  // namespace troupe::detail
