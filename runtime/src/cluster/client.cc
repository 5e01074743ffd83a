// ClusterClient: a driver's asks to the head, reconnecting while it is away.
#include <mutex>
#include <random>
#include <thread>

#include "cluster/protocol.h"
#include "troupe/cluster.h"

namespace troupe {

using namespace cluster;
using Clock = std::chrono::steady_clock;

struct ClusterClient::State {
  Runtime* rt;
  std::string address;
  std::mutex mu;
  AnyRef head;  // under mu; replaced when the head comes back
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

/// Errors after which the head may answer again once it is back.
bool head_lost(ErrorCode code) { return code == ErrorCode::peer_lost || code == ErrorCode::actor_dead; }

std::string request_id() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return std::to_string(rng()) + "-" + std::to_string(rng());
}

}  // namespace

Result<ClusterClient> ClusterClient::connect(Runtime& rt, const std::string& head_address,
                                             std::chrono::milliseconds timeout) {
  std::string address = head_address;
  if (address.find("://") == std::string::npos) address = "tcp://" + address;
  auto head = resolve_head(rt, address, timeout);
  if (!head) return error(head.error());
  auto state = std::make_shared<State>();
  state->rt = &rt;
  state->address = address;
  state->head = *head;
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
    bool retry = idempotent ? head_lost(r.error().code()) : r.error().code() == ErrorCode::actor_dead || !head;
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
