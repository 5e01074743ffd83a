// ClusterClient: a driver's asks to the head, reconnecting while it is away.
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "cluster/client_state.h"
#include "cluster/protocol.h"
#include "troupe/cluster.h"
#include "troupe/detail/relay.h"
#include "troupe/worker.h"

namespace troupe {

using namespace cluster;
using Clock = std::chrono::steady_clock;

/// An actor that exists as long as the driver's runtime: the head watches it
/// to stop the driver's owned actors when the driver goes.
struct OwnerAlive {};
class DriverOwner final : public Actor<DriverOwner, OwnerAlive> {
 public:
  void handle(const OwnerAlive&) {}
};


namespace {

Result<AnyRef> resolve_head(Runtime& rt, const std::string& address, std::chrono::milliseconds timeout) {
  auto head = rt.resolve_any(address + "/" + kHeadName, timeout);
  if (!head) {
    return error(head.error().code(), "cluster: no head answers at " + address + " (" + head.error().message() +
                                          "); start one with `troupe start --head`, or check the address");
  }
  return *head;
}

std::string request_id() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return std::to_string(rng()) + "-" + std::to_string(rng());
}

}  // namespace

void ClusterClient::State::refresh_head() {
  std::lock_guard<std::mutex> lock(mu);
  if (refreshing) return;
  refreshing = true;
  if (refresher.joinable()) refresher.join();  // the previous one has finished
  refresher = std::thread([this] {
    auto again = resolve_head(*rt, address, std::chrono::milliseconds(1000));
    std::lock_guard<std::mutex> lock(mu);
    if (again) head = *again;
    refreshing = false;
  });
}

namespace {

/// "Find the incarnation of `actor_id` after `last`" (from a relay).
struct ResolveIncarnation {
  std::string actor_id;
  std::shared_ptr<Location> last;  // the incarnation that died; the resolver's own
  std::function<void(Result<detail::CellPtr>)> done;
  Clock::time_point deadline;
};

/// Asks the head, without blocking, for an actor's next incarnation on
/// behalf of the relays (refs that follow actors) of one driver, retrying
/// while the head is away.
class RelayResolver final : public Actor<RelayResolver, ResolveIncarnation> {
 public:
  explicit RelayResolver(std::weak_ptr<ClusterClient::State> state) : state_(std::move(state)) {}
  void handle(const ResolveIncarnation& m) { attempt(m); }

 private:
  void attempt(ResolveIncarnation m) {
    auto st = state_.lock();
    if (!st) return m.done(error(ErrorCode::shutting_down, "cluster: the client is gone"));
    AnyRef head = st->current_head();
    if (!head) {
      st->refresh_head();
      after(std::chrono::milliseconds(100), [this, m] { attempt(m); });
      return;
    }
    GetActor q{m.actor_id, "", "", 2000, *m.last};
    ask<ActorInfo>(head, q, std::chrono::seconds(4)).then([this, m, head](Result<ActorInfo> r) mutable {
      auto st = state_.lock();
      if (!st) return m.done(error(ErrorCode::shutting_down, "cluster: the client is gone"));
      if (r) {
        auto ref = st->rt->ref_at(r->address, r->ref_id);
        if (!ref) return m.done(error(ref.error()));
        *m.last = Location{r->address, r->ref_id};
        return m.done(detail::CellPtr(ref->cell()));
      }
      ErrorCode code = r.error().code();
      bool head_gone = code == ErrorCode::peer_lost || (code == ErrorCode::actor_dead && detail::cell_dead(head.cell()));
      if (!head_gone && code != ErrorCode::timeout) return m.done(error(r.error()));  // dead for good
      if (Clock::now() >= m.deadline) {
        return m.done(error(ErrorCode::timeout, "actor " + m.actor_id + " is not back after " +
                                                    std::to_string(ClusterClient::kSpawnTimeout.count()) +
                                                    " ms (" + r.error().message() + ")"));
      }
      if (head_gone) st->refresh_head();
      after(std::chrono::milliseconds(head_gone ? 100 : 0), [this, m] { attempt(m); });
    });
  }

  std::weak_ptr<ClusterClient::State> state_;
};

}  // namespace

Result<ClusterClient> ClusterClient::connect(Runtime& rt, const std::string& head_address,
                                             std::chrono::milliseconds timeout) {
  // A program started as a worker that did not call serve_if_worker() first
  // serves here rather than run as a second driver.
  serve_if_worker();
  std::string address = head_address;
  // A bare HOST:PORT speaks this runtime's transport (a ucx driver joins a
  // ucx cluster without spelling the scheme).
  if (address.find("://") == std::string::npos) address = rt.config().transport + "://" + address;
  auto head = resolve_head(rt, address, timeout);
  if (!head) return error(head.error());
  auto state = std::make_shared<State>();
  state->rt = &rt;
  state->address = address;
  state->head = *head;
  if (!rt.address().empty()) {
    state->owner = rt.spawn<DriverOwner>();
    if (auto at = rt.locate(state->owner)) state->owner_at = Location{at->first, at->second};
  }
  std::error_code ec;
  state->executable = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  state->resolver = rt.spawn<RelayResolver>(std::weak_ptr<State>(state));
  return ClusterClient(std::move(state));
}

const std::string& ClusterClient::address() const { return state_->address; }

template <class R, class M>
Result<R> ClusterClient::call(const M& msg, std::chrono::milliseconds timeout, bool idempotent) const {
  auto deadline = Clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  auto backoff = std::chrono::milliseconds(20);
  for (;;) {
    AnyRef head;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      head = state_->head;
    }
    Result<R> r = error(ErrorCode::peer_lost, "cluster: the head at " + state_->address + " is unreachable");
    if (head) r = head.template ask<R>(msg, left()).get();
    // A request that is not idempotent is repeated only when it cannot have
    // reached a head: its ref was already dead (actor_dead from the proxy).
    if (r) return r;
    // actor_dead is the head's own answer (about an actor of the cluster)
    // when the head's ref is alive; from a dead ref it means the head is gone.
    bool ref_dead = !head || detail::cell_dead(head.cell());
    ErrorCode code = r.error().code();
    bool retry = idempotent ? code == ErrorCode::peer_lost || (code == ErrorCode::actor_dead && ref_dead)
                            : code == ErrorCode::actor_dead && ref_dead;
    if (!retry || Clock::now() >= deadline) return r;
    // The head went away: wait for one to answer at the address again.
    std::this_thread::sleep_for(std::min(backoff, left()));  // retry pacing while the head is down
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    auto again = resolve_head(*state_->rt, state_->address, std::min(left(), std::chrono::milliseconds(1000)));
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->head = again ? *again : AnyRef();
  }
}

Result<ClusterStatus> ClusterClient::status(std::chrono::milliseconds timeout) const {
  return call<ClusterStatus>(GetClusterStatus{}, timeout);
}

Future<std::string> ClusterClient::create_placement_group_async(const PlacementGroupSpec& spec,
                                                                 std::chrono::milliseconds timeout) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->head.ask<std::string>(CreatePlacementGroup{spec, request_id()}, timeout);
}

Future<PlacementGroupInfo> ClusterClient::wait_placement_group_async(const std::string& id,
                                                                     std::chrono::milliseconds timeout) const {
  // The head answers by the deadline; the ask waits a little longer so that
  // its answer (with the reason) arrives rather than a bare timeout.
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->head.ask<PlacementGroupInfo>(WaitPlacementGroup{id, timeout.count()},
                                              timeout + std::chrono::seconds(2));
}

Future<void> ClusterClient::remove_placement_group_async(const std::string& id,
                                                         std::chrono::milliseconds timeout) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->head.ask<void>(RemovePlacementGroup{id}, timeout);
}

Result<std::string> ClusterClient::create_placement_group(const PlacementGroupSpec& spec,
                                                          std::chrono::milliseconds timeout) const {
  // One key for every attempt: a retry after a lost answer finds the group.
  return call<std::string>(CreatePlacementGroup{spec, request_id()}, timeout);
}

Result<PlacementGroupInfo> ClusterClient::wait_placement_group(const std::string& id,
                                                               std::chrono::milliseconds timeout) const {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto r = call<PlacementGroupInfo>(WaitPlacementGroup{id, std::max<int64_t>(0, left.count())},
                                      left + std::chrono::seconds(2));
    if (r || r.error().code() != ErrorCode::timeout || Clock::now() >= deadline) return r;
  }
}

Status ClusterClient::remove_placement_group(const std::string& id, std::chrono::milliseconds timeout) const {
  auto r = call<void>(RemovePlacementGroup{id}, timeout);
  return r ? Status() : r.error();
}

Result<std::string> ClusterClient::submit_job(const std::vector<std::string>& command, const std::string& node,
                                              const std::vector<std::string>& env,
                                              std::chrono::milliseconds timeout) const {
  return call<std::string>(SubmitJob{command, node, env}, timeout, /*idempotent=*/false);
}

Result<JobInfo> ClusterClient::job(const std::string& id, std::chrono::milliseconds timeout) const {
  return call<JobInfo>(GetJob{id}, timeout);
}

Result<std::string> ClusterClient::job_logs(const std::string& id, uint64_t offset, uint64_t max_bytes,
                                            std::chrono::milliseconds timeout) const {
  return call<std::string>(ReadJobLog{id, offset, max_bytes}, timeout);
}

Status ClusterClient::stop_job(const std::string& id, std::chrono::milliseconds timeout) const {
  auto r = call<void>(StopJob{id}, timeout);
  return r ? Status() : r.error();
}

}  // namespace troupe

namespace troupe {

Result<AnyRef> ClusterClient::register_name(const AnyRef& actor, const std::string& name, const std::string& ns,
                                            std::chrono::milliseconds timeout) const {
  auto where = state_->rt->locate(actor);
  if (!where) return error(where.error());
  auto holder = call<NamedActor>(cluster::RegisterName{NamedActor{ns, name, where->first, where->second}}, timeout);
  if (!holder) return error(holder.error());
  if (holder->address == where->first && holder->id == where->second) return actor;
  return state_->rt->ref_at(holder->address, holder->id);
}

Result<AnyRef> ClusterClient::get_actor(const std::string& name, const std::string& ns,
                                        std::chrono::milliseconds timeout) const {
  auto holder = call<NamedActor>(cluster::LookupName{ns, name}, timeout);
  if (!holder) return error(holder.error());
  return state_->rt->ref_at(holder->address, holder->id);
}

Status ClusterClient::unregister_name(const std::string& name, const std::string& ns,
                                      std::chrono::milliseconds timeout) const {
  auto r = call<void>(cluster::UnregisterName{ns, name}, timeout);
  return r ? Status() : r.error();
}

}  // namespace troupe

namespace troupe {

SpawnActor spawn_request(const ClusterClient::State& state, const std::string& class_key, std::string args,
                         const ActorOptions& options) {
  SpawnActor m;
  m.spec.class_key = class_key;
  m.spec.args = std::move(args);
  m.spec.executable = state.executable;
  m.spec.options = options;
  m.spec.owner_address = state.owner_at.address;
  m.spec.owner_id = state.owner_at.id;
  m.request_id = request_id();
  m.timeout_ms = ClusterClient::kSpawnTimeout.count();
  return m;
}

Result<ActorInfo> ClusterClient::spawn_encoded(const std::string& class_key, std::string args,
                                               const ActorOptions& options) const {
  // One request key for every attempt: a retry after a lost answer gets the
  // actor the first attempt made.
  return call<ActorInfo>(spawn_request(*state_, class_key, std::move(args), options),
                         kSpawnTimeout + std::chrono::seconds(5));
}

Future<ActorInfo> ClusterClient::spawn_encoded_async(const std::string& class_key, std::string args,
                                                     const ActorOptions& options) const {
  auto m = spawn_request(*state_, class_key, std::move(args), options);
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->head.ask<ActorInfo>(std::move(m), kSpawnTimeout + std::chrono::seconds(5));
}

Result<AnyRef> ClusterClient::ref_to_any(const ActorInfo& info) const {
  if (info.address.empty()) {
    return error(ErrorCode::actor_dead, "actor " + info.id + " is " + info.state +
                                            (info.reason.empty() ? "" : " (" + info.reason + ")") +
                                            "; wait for it with ClusterClient::actor(id, wait_alive)");
  }
  return state_->rt->ref_at(info.address, info.ref_id);
}

Result<detail::CellPtr> ClusterClient::follow_cell(const ActorInfo& info) const {
  auto first = ref_to_any(info);
  if (!first) return error(first.error());
  auto last = std::make_shared<Location>(Location{info.address, info.ref_id});
  AnyRef resolver = state_->resolver;
  std::string id = info.id;
  auto relay = std::make_shared<detail::Relay>(
      detail::CellPtr(first->cell()),
      [resolver, id, last](std::function<void(Result<detail::CellPtr>)> done) {
        Status s = resolver.tell(ResolveIncarnation{id, last, done, Clock::now() + kSpawnTimeout});
        if (!s.ok()) done(error(ErrorCode::shutting_down, "cluster: the driver's runtime is shutting down"));
      },
      info.options.max_task_retries);
  detail::CellPtr cell = detail::spawn_relay(*state_->rt, std::move(relay), "cluster/" + info.id);
  if (!cell) return error(ErrorCode::shutting_down, "cluster: the driver's runtime is shutting down");
  return cell;
}

Result<ActorInfo> ClusterClient::actor(const std::string& id, std::chrono::milliseconds wait_alive,
                                       std::chrono::milliseconds timeout) const {
  return call<ActorInfo>(GetActor{id, "", "", wait_alive.count(), {}},
                         std::max(timeout, wait_alive + std::chrono::seconds(2)));
}

Result<ActorInfo> ClusterClient::actor_named(const std::string& name, const std::string& ns,
                                             std::chrono::milliseconds wait_alive,
                                             std::chrono::milliseconds timeout) const {
  return call<ActorInfo>(GetActor{"", ns, name, wait_alive.count(), {}},
                         std::max(timeout, wait_alive + std::chrono::seconds(2)));
}

Result<std::vector<ActorInfo>> ClusterClient::list_actors(std::chrono::milliseconds timeout) const {
  return call<std::vector<ActorInfo>>(ListActors{}, timeout);
}

Status ClusterClient::watch(const std::vector<std::string>& ids, const AnyRef& watcher,
                            std::chrono::milliseconds timeout) const {
  auto r = call<void>(WatchActors{ids, watcher}, timeout);
  return r ? Status() : r.error();
}

Status ClusterClient::kill_actor(const std::string& id, std::chrono::milliseconds timeout) const {
  auto r = call<void>(KillActor{id}, timeout);
  return r ? Status() : r.error();
}

}  // namespace troupe
