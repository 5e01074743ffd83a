// The head's actor table: placing actors on nodes (their own resources, a
// placement-group bundle, or a label selector), starting worker processes
// through the agents, restarting actors by their options when they crash or
// their process or node dies, and stopping owned actors with their owner.
// Snapshots are kept in the store, so that a restart anywhere has them.
#include <algorithm>
#include <cmath>

#include "agent/process.h"
#include "head/head_actor.h"
#include "log.h"

namespace troupe::cluster {

namespace {

using Clock = std::chrono::steady_clock;

std::string name_key(const ActorOptions& o) { return o.ns + "/" + o.name; }

bool fits_in(const ResourceMap& bundle, const ResourceMap& used, const ResourceMap& want) {
  for (auto& [name, amount] : want) {
    if (amount <= 0) continue;
    auto have = bundle.find(name);
    auto in_use = used.find(name);
    double free = (have == bundle.end() ? 0 : have->second) - (in_use == used.end() ? 0 : in_use->second);
    if (free + 1e-9 < amount) return false;
  }
  return true;
}

/// Errors after which creating the actor again cannot help.
bool hopeless_error(ErrorCode code) { return code == ErrorCode::not_found || code == ErrorCode::malformed; }

constexpr size_t kDeadActorsKept = 1000;
constexpr std::chrono::seconds kWorkerStartAsk{40};
// A creation is answered once the actor's constructor and on_start have run
// (loading a checkpoint, starting a GPU): bounded, but generously.
constexpr std::chrono::seconds kCreateAsk{300};

}  // namespace

Status HeadActor::write(std::vector<Store::Change> changes) {
  if (batch_ != nullptr) {
    for (auto& c : changes) batch_->push_back(std::move(c));
    return {};
  }
  return store_->apply(changes);
}

Status HeadActor::persist_actor(const ClusterActor& a) {
  return write({{"actor", a.rec.info.id, codec::encode(a.rec)}});
}

Deferred<ActorInfo> HeadActor::handle(const SpawnActor& m) {
  auto reply = defer<ActorInfo>();
  auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, m.timeout_ms));
  auto wait_for = [&](ClusterActor& a) {
    if (a.rec.info.state == "alive") {
      reply.complete(a.rec.info);
    } else {
      a.waiters.push_back(ActorWaiter{[reply](const ActorInfo& info, const Status& s) mutable {
                                        s.ok() ? reply.complete(info) : reply.fail(s);
                                      },
                                      deadline});
    }
  };
  if (!m.request_id.empty()) {
    // A retry of a request this head (or its predecessor) already took.
    if (auto it = actor_requests_.find(m.request_id); it != actor_requests_.end()) {
      if (auto a = actors_.find(it->second); a != actors_.end()) {
        wait_for(a->second);
        return reply;
      }
      for (auto& dead : dead_actors_) {
        if (dead.id == it->second) {
          reply.fail(Status(ErrorCode::actor_dead, "actor " + dead.id + " is dead: " + dead.reason));
          return reply;
        }
      }
    }
  }
  const ActorSpec& spec = m.spec;
  const ActorOptions& o = spec.options;
  auto invalid = [&](std::string why) {
    reply.fail(Status(ErrorCode::invalid_argument, "spawn: " + why));
    return reply;
  };
  if (spec.class_key.empty() || spec.executable.empty()) return invalid("no actor class or program");
  if (o.max_restarts < -1) return invalid("max_restarts must be >= -1 (-1: without limit)");
  for (auto& [name, amount] : o.resources) {
    if (!(amount >= 0)) return invalid("resource " + name + " must be >= 0");
  }
  if (!o.placement_group.empty()) {
    auto g = groups_.find(o.placement_group);
    if (g == groups_.end()) return invalid("placement group " + o.placement_group + " does not exist");
    if (o.bundle < -1 || o.bundle >= static_cast<int>(g->second.info.spec.bundles.size())) {
      return invalid("placement group " + o.placement_group + " has no bundle " + std::to_string(o.bundle));
    }
  }
  if (!o.detached && spec.owner_address.empty()) {
    return invalid("an owned actor needs a driver that listens (RuntimeConfig::listen), so that the cluster "
                   "notices when it goes; set it, or spawn with ActorOptions::detached");
  }
  if (!o.name.empty()) {
    // Get-or-create: the first to name it wins; all get the same actor.
    if (auto n = names_.find(name_key(o)); n != names_.end()) {
      if (auto a = actors_.find(n->second.actor_id); !n->second.actor_id.empty() && a != actors_.end()) {
        wait_for(a->second);
      } else {
        ActorInfo holder;
        holder.state = "alive";
        holder.address = n->second.entry.address;
        holder.ref_id = n->second.entry.id;
        holder.options.name = o.name;
        holder.options.ns = o.ns;
        reply.complete(holder);
      }
      return reply;
    }
  }
  // Written to the store once it is alive, before that is answered: a head
  // that dies before then has not answered, and the driver's retry (same
  // request id) makes it again; an incarnation made meanwhile is stopped
  // when the new head adopts its worker.
  ClusterActor a;
  a.rec.spec = spec;
  a.rec.info.id = random_id("actor");
  a.rec.info.class_name = spec.class_key;
  a.rec.info.state = "pending";
  a.rec.info.options = o;
  std::string id = a.rec.info.id;
  if (!m.request_id.empty()) actor_requests_[m.request_id] = id;
  if (!o.name.empty()) {
    Named& n = names_[name_key(o)];
    n.entry = NamedActor{o.ns, o.name, "", 0};
    n.actor_id = id;
  }
  watch_owner(a);
  ClusterActor& stored = actors_.emplace(id, std::move(a)).first->second;
  wait_for(stored);
  schedule_actor(id);
  return reply;
}

void HeadActor::watch_owner(const ClusterActor& a) {
  if (a.rec.spec.options.detached) return;
  auto key = std::make_pair(a.rec.spec.owner_address, a.rec.spec.owner_id);
  Owner& owner = owners_[key];
  owner.actors.insert(a.rec.info.id);
  if (owner.monitor != 0 || !config_.ref_at) return;
  auto ref = config_.ref_at(key.first, key.second);
  auto gone = [this, key](const std::string& why) {
    auto it = owners_.find(key);
    if (it == owners_.end()) return;
    std::set<std::string> owned = std::move(it->second.actors);
    owners_.erase(it);
    for (const std::string& id : owned) actor_dead(id, "its owner (the driver at " + key.first + ") " + why, true);
  };
  if (!ref) {
    after(std::chrono::milliseconds(0), [gone] { gone("is unreachable"); });
    owner.monitor = 1;  // not 0: one notice only
    return;
  }
  owner.monitor = monitor(*ref, [gone](const Down& d) { gone("is gone (" + d.reason.to_string() + ")"); });
}

NodeIndex HeadActor::place_actor(ClusterActor& a, std::string* why, bool* hopeless) {
  const ActorOptions& o = a.rec.spec.options;
  *hopeless = false;
  if (!o.colocate_with.empty()) {
    auto anchor = actors_.find(o.colocate_with);
    if (anchor == actors_.end()) {
      *hopeless = true;
      *why = "the actor it is colocated with (" + o.colocate_with + ") is gone";
      return kNoNode;
    }
    const ActorInfo& at = anchor->second.rec.info;
    NodeIndex node = at.state == "alive" ? ledger_.find_node(at.node) : kNoNode;
    if (node == kNoNode || !workers_.count(at.worker)) {
      *why = "waiting for the actor it is colocated with (" + o.colocate_with + ", " + at.state + ")";
      return kNoNode;
    }
    if (!ledger_.acquire(node, o.resources)) {
      *why = "waiting for resources: node " + at.node + " of " + o.colocate_with + " has not " +
             describe(o.resources) + " free";
      return kNoNode;
    }
    a.holds_on = node;
    return node;
  }
  if (!o.placement_group.empty()) {
    auto g = groups_.find(o.placement_group);
    if (g == groups_.end()) {
      *hopeless = true;
      *why = "its placement group " + o.placement_group + " was removed";
      return kNoNode;
    }
    const PlacementGroupInfo& info = g->second.info;
    if (info.state != "created") {
      *why = "its placement group " + info.id + " is " + info.state + (info.reason.empty() ? "" : ": " + info.reason);
      return kNoNode;
    }
    int first = o.bundle < 0 ? 0 : o.bundle;
    int last = o.bundle < 0 ? static_cast<int>(info.spec.bundles.size()) - 1 : o.bundle;
    for (int b = first; b <= last; ++b) {
      ResourceMap& used = bundle_used_[{info.id, b}];
      if (!fits_in(info.spec.bundles[b].resources, used, o.resources)) continue;
      auto node = nodes_.find(info.bundle_nodes[b]);
      if (node == nodes_.end() || node->second.info.state != "alive") continue;
      for (auto& [name, amount] : o.resources) used[name] += amount;
      a.in_bundle = b;
      return node->second.index;
    }
    *why = "no bundle of placement group " + info.id + (o.bundle < 0 ? "" : " (bundle " + std::to_string(o.bundle) + ")") +
           " has " + describe(o.resources) + " left";
    return kNoNode;
  }
  std::vector<Node*> candidates;
  bool any_match = false;
  for (auto& [id, n] : nodes_) {
    if (n.info.state != "alive" || n.index == kNoNode || !matches(o.label_selector, n.info.labels)) continue;
    any_match = true;
    // Restored and its agent not back yet, or its agent just lost (the node's
    // death is on its way).
    if (!n.agent || detail::cell_dead(n.agent.cell())) continue;
    candidates.push_back(&n);
  }
  // Back where it was when that node is still there: its worker is likely
  // warm, and what it kept on local disk is there.
  auto try_node = [&](Node* n) {
    if (!ledger_.acquire(n->index, o.resources)) return false;
    a.holds_on = n->index;
    return true;
  };
  for (Node* n : candidates) {
    if (n->info.id == a.rec.info.node && try_node(n)) return n->index;
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    Node* n = candidates[(next_actor_node_ + i) % candidates.size()];
    if (try_node(n)) {
      next_actor_node_ = (next_actor_node_ + i + 1) % candidates.size();
      return n->index;
    }
  }
  *why = !any_match ? "no alive node matches its label selector"
         : candidates.empty() ? "waiting for the agents to come back"
                              : "waiting for resources: no node has " + describe(o.resources) + " free";
  return kNoNode;
}

void HeadActor::release_actor_resources(ClusterActor& a) {
  const ActorOptions& o = a.rec.spec.options;
  if (a.holds_on != kNoNode) {
    if (ledger_.node(a.holds_on).alive) ledger_.give_back(a.holds_on, o.resources);
    a.holds_on = kNoNode;
  }
  if (a.in_bundle >= 0) {
    auto it = bundle_used_.find({o.placement_group, a.in_bundle});
    if (it != bundle_used_.end()) {
      for (auto& [name, amount] : o.resources) it->second[name] -= amount;
    }
    a.in_bundle = -1;
  }
}

void HeadActor::leave_worker(const std::string& worker_id, const std::string& actor_id) {
  auto w = workers_.find(worker_id);
  if (w == workers_.end()) return;
  w->second.hosted.erase(actor_id);
  // A process of its own goes with its actor (shared workers stay, warm).
  if (!w->second.rec.dedicated || !w->second.hosted.empty() || !w->second.queued.empty()) return;
  auto node = nodes_.find(w->second.rec.node);
  if (node != nodes_.end() && node->second.agent) (void)node->second.agent.tell(StopWorker{worker_id});
}

void HeadActor::schedule_actor(const std::string& id) {
  auto it = actors_.find(id);
  if (it == actors_.end()) return;
  ClusterActor& a = it->second;
  std::string why;
  bool hopeless = false;
  NodeIndex node = place_actor(a, &why, &hopeless);
  if (node == kNoNode) {
    if (hopeless) {
      actor_dead(id, why, false);
      return;
    }
    if (a.rec.info.state != "restarting") a.rec.info.state = "pending";
    a.rec.info.reason = why;
    if (std::find(pending_actors_.begin(), pending_actors_.end(), id) == pending_actors_.end()) {
      pending_actors_.push_back(id);
    }
    return;
  }
  if (a.rec.info.state != "restarting") a.rec.info.state = "starting";
  a.rec.info.reason.clear();
  a.rec.info.node = ledger_.node(node).id;
  Worker* w = nullptr;
  if (const std::string& anchor = a.rec.spec.options.colocate_with; !anchor.empty()) {
    w = &workers_.find(actors_.find(anchor)->second.rec.info.worker)->second;  // place_actor checked both
  } else {
    w = worker_for(a.rec.info.node, a);
  }
  if (w == nullptr) {
    // No worker can start there now (its agent just went): wait for a place.
    release_actor_resources(a);
    a.rec.info.reason = "no worker can start on node " + a.rec.info.node + " now";
    pending_actors_.push_back(id);
    return;
  }
  if (w->ready) {
    create_on(*w, id);
  } else {
    w->queued.push_back(id);
  }
}

void HeadActor::place_pending_actors() {
  if (pending_actors_.empty()) return;
  std::vector<std::string> todo = std::move(pending_actors_);
  pending_actors_.clear();
  for (const std::string& id : todo) schedule_actor(id);
}

HeadActor::Worker* HeadActor::worker_for(const std::string& node, const ClusterActor& a) {
  const std::string& program = a.rec.spec.executable;
  bool dedicated = a.rec.spec.options.dedicated_process;
  if (!dedicated) {
    if (auto it = shared_workers_.find({node, program}); it != shared_workers_.end()) {
      if (auto w = workers_.find(it->second); w != workers_.end()) return &w->second;
    }
  }
  Worker w;
  w.rec.id = random_id("worker");
  w.rec.node = node;
  w.rec.executable = program;
  w.rec.dedicated = dedicated;
  if (const double gpus = dedicated ? gpu_demand(a) : 0; gpus > 0 && !take_gpus(w, gpus)) {
    TROUPE_LOG(warn, "event=worker_gpus_fragmented worker={} node={} gpus={} reason=\"no whole free GPU or share "
                     "left for it; the process sees every GPU of the node\"",
               w.rec.id, node, gpus);
  }
  std::string wid = w.rec.id;
  Worker& stored = workers_.emplace(wid, std::move(w)).first->second;
  if (!dedicated) shared_workers_[{node, program}] = wid;
  start_worker(stored);
  auto again = workers_.find(wid);  // start_worker may have failed it at once
  return again == workers_.end() ? nullptr : &again->second;
}

double HeadActor::gpu_demand(const ClusterActor& a) const {
  const ActorOptions& o = a.rec.spec.options;
  const ResourceMap* demand = &o.resources;
  if (!o.placement_group.empty() && o.bundle >= 0) {
    auto g = groups_.find(o.placement_group);
    if (g != groups_.end() && static_cast<size_t>(o.bundle) < g->second.info.spec.bundles.size()) {
      demand = &g->second.info.spec.bundles[static_cast<size_t>(o.bundle)].resources;
    }
  }
  auto gpu = demand->find("GPU");
  return gpu == demand->end() ? 0 : gpu->second;
}

bool HeadActor::take_gpus(Worker& w, double gpus) {
  auto node = nodes_.find(w.rec.node);
  if (node == nodes_.end()) return false;
  auto total = node->second.info.total.find("GPU");
  if (total == node->second.info.total.end()) return false;
  // The node's GPU indices: as many as it has whole GPUs (the ledger saw
  // to it that the amount fits; this picks which).
  std::vector<double>& use = gpu_use_[w.rec.node];
  use.resize(std::max(use.size(), static_cast<size_t>(std::floor(total->second + 1e-9))), 0.0);
  constexpr double kSlack = 1e-9;
  std::vector<uint32_t> picked;
  double share = 1;
  if (gpus >= 1 - kSlack) {
    const size_t need = static_cast<size_t>(std::ceil(gpus - kSlack));
    for (size_t g = 0; g < use.size() && picked.size() < need; ++g) {
      if (use[g] <= kSlack) picked.push_back(static_cast<uint32_t>(g));
    }
    if (picked.size() < need) return false;
  } else {
    // A share: the fullest GPU it still fits on, so that whole GPUs stay free.
    share = gpus;
    size_t best = use.size();
    for (size_t g = 0; g < use.size(); ++g) {
      if (use[g] + share <= 1 + kSlack && (best == use.size() || use[g] > use[best])) best = g;
    }
    if (best == use.size()) return false;
    picked.push_back(static_cast<uint32_t>(best));
  }
  for (uint32_t g : picked) use[g] += share;
  w.rec.gpus = std::move(picked);
  w.rec.gpu_share = share;
  return true;
}

void HeadActor::give_back_gpus(const Worker& w) {
  auto use = gpu_use_.find(w.rec.node);
  if (use == gpu_use_.end()) return;
  for (uint32_t g : w.rec.gpus) {
    if (g < use->second.size()) use->second[g] = std::max(0.0, use->second[g] - w.rec.gpu_share);
  }
}

void HeadActor::start_worker(Worker& w) {
  std::string wid = w.rec.id;
  auto node = nodes_.find(w.rec.node);
  if (node == nodes_.end() || !node->second.agent) {
    worker_dead(wid, "its node " + w.rec.node + " has no agent");
    return;
  }
  ask<WorkerStarted>(node->second.agent, StartWorker{wid, w.rec.executable, !w.rec.gpus.empty(), w.rec.gpus},
                    kWorkerStartAsk)
      .then([this, wid](Result<WorkerStarted> r) {
        auto it = workers_.find(wid);
        if (it == workers_.end()) return;
        Worker& w = it->second;
        if (!r) {
          TROUPE_LOG(warn, "event=worker_start_failed worker={} node={} reason=\"{}\"", wid, w.rec.node,
                     r.error().message());
          std::vector<std::string> queued = std::move(w.queued);
          std::string why = "its worker process could not start: " + r.error().message();
          worker_dead(wid, why);
          ErrorCode code = r.error().code();
          if (code == ErrorCode::peer_lost || code == ErrorCode::actor_dead) {
            // The agent is gone (its node's death is on its way here): the
            // actors wait for a place again, elsewhere once the node is dead.
            for (const std::string& id : queued) {
              auto a = actors_.find(id);
              if (a == actors_.end()) continue;
              release_actor_resources(a->second);
              a->second.rec.info.reason = why;
              pending_actors_.push_back(id);
            }
            return;
          }
          // A program that cannot serve as a worker will not do better the
          // next time: its actors fail for good, with the reason.
          for (const std::string& id : queued) actor_dead(id, why, false);
          return;
        }
        w.rec.where = r->where;
        w.ready = true;
        watch_worker(w);
        if (Status s = store_->put("worker", wid, codec::encode(w.rec)); !s.ok()) {
          TROUPE_LOG(err, "event=store_write_failed kind=worker id={} reason=\"{}\"", wid, s.message());
        }
        TROUPE_LOG(debug, "event=worker_ready worker={} node={} pid={}", wid, w.rec.node, r->pid);
        std::vector<std::string> queued = std::move(w.queued);
        w.queued.clear();
        for (const std::string& id : queued) {
          auto wi = workers_.find(wid);
          if (wi == workers_.end()) break;
          create_on(wi->second, id);
        }
      });
}

void HeadActor::watch_worker(Worker& w) {
  std::string wid = w.rec.id;
  auto ref = config_.ref_at ? config_.ref_at(w.rec.where.address, w.rec.where.id)
                            : Result<AnyRef>(error(ErrorCode::unsupported, "no ref_at"));
  if (!ref) {
    after(std::chrono::milliseconds(0), [this, wid, why = ref.error().message()] { worker_dead(wid, why); });
    return;
  }
  w.ref = *ref;
  w.monitor = monitor(w.ref, [this, wid](const Down& d) { worker_dead(wid, d.reason.to_string()); });
}

void HeadActor::create_on(Worker& w, const std::string& actor_id) {
  auto it = actors_.find(actor_id);
  if (it == actors_.end()) return;
  ClusterActor& a = it->second;
  uint64_t attempt = ++a.attempt;
  CreateActor msg;
  msg.actor_id = actor_id;
  msg.class_key = a.rec.spec.class_key;
  msg.args = a.rec.spec.args;
  msg.mailbox_bound = a.rec.spec.options.mailbox_bound;
  msg.snapshot_every = a.rec.spec.options.snapshot_every;
  if (a.rec.info.restarts > 0) {
    if (auto snap = store_->get("snap", actor_id); snap && *snap) msg.snapshot = std::move(**snap);
  } else if (const std::string& from = a.rec.spec.options.restore_from; !from.empty()) {
    if (auto snap = store_->get("snap", from); snap && *snap) {
      // Its own until it takes one: a later restore_from of it has the state.
      (void)store_->put("snap", actor_id, **snap);
      msg.snapshot = std::move(**snap);
    }
  }
  msg.head = self();
  std::string wid = w.rec.id;
  w.hosted.insert(actor_id);
  ask<Location>(w.ref, std::move(msg), kCreateAsk).then([this, actor_id, attempt, wid](Result<Location> r) {
    auto it = actors_.find(actor_id);
    bool current = it != actors_.end() && it->second.attempt == attempt && it->second.rec.info.state != "dead";
    if (!current) {
      // Killed (or re-created elsewhere) meanwhile: stop what was made.
      auto w = workers_.find(wid);
      if (r && w != workers_.end() && w->second.ref) (void)w->second.ref.tell(StopActor{actor_id});
      return;
    }
    if (!r) {
      if (r.error().code() == ErrorCode::timeout) {
        // It may still come up there after this: it must not live on unseen.
        if (auto w = workers_.find(wid); w != workers_.end() && w->second.ref) (void)w->second.ref.tell(StopActor{actor_id});
      }
      leave_worker(wid, actor_id);
      if (hopeless_error(r.error().code())) {
        actor_dead(actor_id, "it cannot be created: " + r.error().message(), false);
      } else if (r.error().code() == ErrorCode::start_failed && it->second.rec.info.restarts == 0) {
        // Its first creation threw: the same arguments would throw again.
        actor_dead(actor_id, "it failed to start: " + r.error().message(), false);
      } else if (r.error().code() == ErrorCode::start_failed) {
        // A restart that threw (its state or its node's changed since): again,
        // after 100 ms, doubling to 10 s while it keeps failing.
        const uint32_t n = std::min<uint32_t>(it->second.failed_starts++, 7);
        actor_failed(actor_id, "restarting it failed: " + r.error().message(),
                     std::min(std::chrono::milliseconds(100) * (1u << n), std::chrono::milliseconds(10000)));
      } else {
        actor_failed(actor_id, "creating it failed: " + r.error().message());
      }
      return;
    }
    actor_alive(it->second, wid, *r);
  });
}

void HeadActor::actor_alive(ClusterActor& a, const std::string& worker, const Location& where) {
  ActorInfo& info = a.rec.info;
  a.failed_starts = 0;
  info.state = "alive";
  info.reason.clear();
  info.worker = worker;
  info.address = where.address;
  info.ref_id = where.id;
  if (Status s = persist_actor(a); !s.ok()) {
    TROUPE_LOG(err, "event=store_write_failed kind=actor id={} reason=\"{}\"", info.id, s.message());
    if (info.restarts == 0) {
      // Not answered as alive unless it is on record: refuse it whole.
      actor_dead(info.id, "it could not be recorded: " + s.message(), true);
      return;
    }
  }
  const ActorOptions& o = a.rec.spec.options;
  if (!o.name.empty()) {
    if (auto n = names_.find(name_key(o)); n != names_.end() && n->second.actor_id == info.id) {
      n->second.entry.address = where.address;
      n->second.entry.id = where.id;
    }
  }
  TROUPE_LOG(debug, "event=actor_alive actor={} node={} restarts={}", info.id, info.node, info.restarts);
  if (info.restarts > 0) tell_watchers(a);
  answer_waiters(a, Status());
  // Actors colocated with this one may have waited for it.
  if (!pending_actors_.empty()) place_pending_actors();
}

void HeadActor::answer_waiters(ClusterActor& a, const Status& status) {
  std::vector<ActorWaiter> waiters = std::move(a.waiters);
  a.waiters.clear();
  ActorInfo info = a.rec.info;  // a waiter may change the table
  for (auto& w : waiters) w.fn(info, status);
}

void HeadActor::tell_watchers(const ClusterActor& a) {
  if (a.watchers.empty()) return;
  ActorEvent e{a.rec.info.id, a.rec.info.state, a.rec.info.reason, a.rec.info.restarts};
  for (const AnyRef& w : a.watchers) (void)w.tell(e);
}

Result<void> HeadActor::handle(const WatchActors& m) {
  if (!m.watcher) return error(ErrorCode::invalid_argument, "watch: no watcher");
  for (const std::string& id : m.ids) {
    auto it = actors_.find(id);
    if (it == actors_.end()) return error(ErrorCode::not_found, "watch: actor " + id + " does not exist (or is dead)");
  }
  for (const std::string& id : m.ids) actors_.find(id)->second.watchers.push_back(m.watcher);
  return {};
}

void HeadActor::actor_failed(const std::string& id, const std::string& why, std::chrono::milliseconds delay) {
  auto it = actors_.find(id);
  if (it == actors_.end() || it->second.rec.info.state == "dead") return;
  ClusterActor& a = it->second;
  int max = a.rec.spec.options.max_restarts;
  if (max != -1 && static_cast<int>(a.rec.info.restarts) >= max) {
    actor_dead(id, why + " (max_restarts " + std::to_string(max) + (max == 0 ? ")" : " used up)"), false);
    return;
  }
  leave_worker(a.rec.info.worker, id);
  ++a.attempt;  // an answer to a creation still in flight is stale now
  release_actor_resources(a);
  a.rec.info.restarts++;
  a.rec.info.state = "restarting";
  a.rec.info.reason = why;
  a.rec.info.address.clear();
  a.rec.info.ref_id = 0;
  if (Status s = persist_actor(a); !s.ok()) {
    TROUPE_LOG(err, "event=store_write_failed kind=actor id={} reason=\"{}\"", id, s.message());
  }
  TROUPE_LOG(info, "event=actor_restarting actor={} restarts={} reason=\"{}\"", id, a.rec.info.restarts, why);
  tell_watchers(a);
  if (delay.count() > 0) {
    const uint64_t attempt = a.attempt;
    after(delay, [this, id, attempt] {
      // Unless it was killed, or placed again some other way, meanwhile.
      if (auto again = actors_.find(id); again != actors_.end() && again->second.attempt == attempt &&
                                         again->second.rec.info.state == "restarting") {
        schedule_actor(id);
      }
    });
    return;
  }
  schedule_actor(id);
}

void HeadActor::actor_dead(const std::string& id, const std::string& why, bool stop_it) {
  auto it = actors_.find(id);
  if (it == actors_.end()) return;
  ClusterActor& a = it->second;
  ++a.attempt;
  if (stop_it) {
    if (auto w = workers_.find(a.rec.info.worker); w != workers_.end() && w->second.ref) {
      (void)w->second.ref.tell(StopActor{id});
    }
  }
  leave_worker(a.rec.info.worker, id);
  bool freed = a.holds_on != kNoNode || a.in_bundle >= 0;
  release_actor_resources(a);
  const ActorOptions& o = a.rec.spec.options;
  if (!o.name.empty()) {
    if (auto n = names_.find(name_key(o)); n != names_.end() && n->second.actor_id == id) names_.erase(n);
  }
  if (!o.detached) {
    auto owner = owners_.find({a.rec.spec.owner_address, a.rec.spec.owner_id});
    if (owner != owners_.end()) owner->second.actors.erase(id);
  }
  pending_actors_.erase(std::remove(pending_actors_.begin(), pending_actors_.end(), id), pending_actors_.end());
  a.rec.info.state = "dead";
  a.rec.info.reason = why;
  // Its snapshot stays while it is among the last dead ones (restore_from).
  std::vector<Store::Change> gone{{"actor", id, std::nullopt}};
  if (dead_actors_.size() >= kDeadActorsKept) {
    gone.push_back({"snap", dead_actors_.front().id, std::nullopt});
    dead_actors_.pop_front();
  }
  (void)write(std::move(gone));
  TROUPE_LOG(info, "event=actor_dead actor={} reason=\"{}\"", id, why);
  tell_watchers(a);
  answer_waiters(a, Status(ErrorCode::actor_dead, "actor " + id + " is dead: " + why));
  dead_actors_.push_back(a.rec.info);
  actors_.erase(it);
  if (freed) place_pending_actors();  // its resources are free: others may fit now
}

void HeadActor::worker_dead(const std::string& worker_id, const std::string& why) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  Worker w = std::move(it->second);
  workers_.erase(it);
  give_back_gpus(w);
  if (w.monitor != 0) demonitor(w.monitor);
  auto shared = shared_workers_.find({w.rec.node, w.rec.executable});
  if (shared != shared_workers_.end() && shared->second == worker_id) shared_workers_.erase(shared);
  (void)write({{"worker", worker_id, std::nullopt}});
  TROUPE_LOG(info, "event=worker_dead worker={} node={} actors={} reason=\"{}\"", worker_id, w.rec.node,
             w.hosted.size() + w.queued.size(), why);
  std::string what = "its worker process died (" + why + ")";
  // One commit for all of its actors (thousands, on a busy worker).
  std::vector<Store::Change> batch;
  bool outer = batch_ == nullptr;
  if (outer) batch_ = &batch;
  for (const std::string& id : w.hosted) actor_failed(id, what);
  for (const std::string& id : w.queued) actor_failed(id, what);
  if (outer) {
    batch_ = nullptr;
    if (Status s = store_->apply(batch); !s.ok()) {
      TROUPE_LOG(err, "event=store_write_failed kind=actor reason=\"{}\"", s.message());
    }
  }
}

void HeadActor::handle(const WorkerExited& m) {
  worker_dead(m.worker_id, "exit code " + std::to_string(exit_code_of(m.status)));
}

void HeadActor::handle(const ActorExited& m) {
  auto it = actors_.find(m.actor_id);
  if (it == actors_.end()) return;
  ActorInfo& info = it->second.rec.info;
  if ((info.state != "alive" && info.state != "recovering") || info.address != m.where.address || info.ref_id != m.where.id) return;  // stale
  if (m.crashed) {
    actor_failed(m.actor_id, "it crashed: " + m.reason);
  } else {
    actor_dead(m.actor_id, "it stopped (" + m.reason + ")", false);
  }
}

void HeadActor::handle(const SaveSnapshot& m) {
  if (!actors_.count(m.actor_id)) return;
  if (Status s = store_->put("snap", m.actor_id, m.bytes); !s.ok()) {
    TROUPE_LOG(err, "event=store_write_failed kind=snap id={} reason=\"{}\"", m.actor_id, s.message());
  }
}

Deferred<ActorInfo> HeadActor::handle(const GetActor& m) {
  auto reply = defer<ActorInfo>();
  std::string id = m.id;
  if (id.empty()) {
    auto n = names_.find(m.ns + "/" + m.name);
    if (n == names_.end() || n->second.actor_id.empty()) {
      reply.fail(Status(ErrorCode::not_found, "no actor of the cluster is named '" + m.name + "' in namespace '" +
                                                  m.ns + "'"));
      return reply;
    }
    id = n->second.actor_id;
  }
  auto it = actors_.find(id);
  if (it == actors_.end()) {
    for (auto& dead : dead_actors_) {
      if (dead.id == id) {
        reply.fail(Status(ErrorCode::actor_dead, "actor " + id + " is dead: " + dead.reason));
        return reply;
      }
    }
    reply.fail(Status(ErrorCode::not_found, "actor " + id + " does not exist"));
    return reply;
  }
  ClusterActor& a = it->second;
  bool gone = a.rec.info.address == m.not_at.address && a.rec.info.ref_id == m.not_at.id;
  if (m.wait_alive_ms <= 0 || (a.rec.info.state == "alive" && !gone)) {
    reply.complete(a.rec.info);
  } else {
    a.waiters.push_back(ActorWaiter{[reply](const ActorInfo& info, const Status& s) mutable {
                                      s.ok() ? reply.complete(info) : reply.fail(s);
                                    },
                                    Clock::now() + std::chrono::milliseconds(m.wait_alive_ms),
                                    /*alive_at_deadline_ok=*/gone});
  }
  return reply;
}

std::vector<ActorInfo> HeadActor::handle(const ListActors&) {
  std::vector<ActorInfo> out;
  out.reserve(actors_.size() + dead_actors_.size());
  for (auto& [id, a] : actors_) out.push_back(a.rec.info);
  out.insert(out.end(), dead_actors_.begin(), dead_actors_.end());
  return out;
}

Result<void> HeadActor::handle(const KillActor& m) {
  if (!actors_.count(m.id)) return error(ErrorCode::not_found, "actor " + m.id + " does not exist (or is dead)");
  actor_dead(m.id, "killed on request", true);
  return {};
}

void HeadActor::expire_actor_waiters(Clock::time_point now) {
  for (auto& [id, a] : actors_) {
    if (a.waiters.empty()) continue;
    auto& ws = a.waiters;
    std::vector<ActorWaiter> expired;
    for (auto w = ws.begin(); w != ws.end();) {
      if (w->deadline <= now) {
        expired.push_back(std::move(*w));
        w = ws.erase(w);
      } else {
        ++w;
      }
    }
    for (auto& w : expired) {
      if (w.alive_at_deadline_ok && a.rec.info.state == "alive") {
        w.fn(a.rec.info, Status());
        continue;
      }
      w.fn(a.rec.info, Status(ErrorCode::timeout, "actor " + id + " is still " + a.rec.info.state +
                                                      (a.rec.info.reason.empty() ? "" : ": " + a.rec.info.reason)));
    }
  }
}

void HeadActor::stop_group_actors(const std::string& group) {
  std::vector<std::string> in_group;
  for (auto& [id, a] : actors_) {
    if (a.rec.spec.options.placement_group == group) in_group.push_back(id);
  }
  for (const std::string& id : in_group) actor_dead(id, "its placement group " + group + " was removed", true);
  for (auto it = bundle_used_.begin(); it != bundle_used_.end();) {
    it = it->first.first == group ? bundle_used_.erase(it) : std::next(it);
  }
}

void HeadActor::load_actors() {
  // Workers first: an actor whose worker is gone is restarted.
  if (auto workers = store_->all("worker")) {
    for (auto& [id, body] : *workers) {
      auto rec = codec::decode<WorkerRecord>(body);
      if (!rec) continue;
      Worker w;
      w.rec = std::move(*rec);
      w.ready = true;
      Worker& stored = workers_.emplace(id, std::move(w)).first->second;
      if (!stored.rec.dedicated) shared_workers_[{stored.rec.node, stored.rec.executable}] = id;
      std::vector<double>& use = gpu_use_[stored.rec.node];
      for (uint32_t g : stored.rec.gpus) {
        if (g >= use.size()) use.resize(g + 1, 0.0);
        use[g] += stored.rec.gpu_share;
      }
    }
  }
  std::vector<std::string> to_schedule;
  if (auto actors = store_->all("actor")) {
    for (auto& [id, body] : *actors) {
      auto rec = codec::decode<ActorRecord>(body);
      if (!rec) {
        TROUPE_LOG(err, "event=store_record_unreadable kind=actor id={} reason=\"{}\"", id, rec.error().message());
        continue;
      }
      ClusterActor a;
      a.rec = std::move(*rec);
      const ActorOptions& o = a.rec.spec.options;
      if (!o.name.empty()) {
        Named& n = names_[name_key(o)];
        n.entry = NamedActor{o.ns, o.name, a.rec.info.address, a.rec.info.ref_id};
        n.actor_id = id;
      }
      auto w = workers_.find(a.rec.info.worker);
      bool running = a.rec.info.state == "alive" && w != workers_.end();
      if (running) {
        // Its resources stay reserved where it runs.
        NodeIndex node = ledger_.find_node(a.rec.info.node);
        if (!o.placement_group.empty()) {
          auto pg = groups_.find(o.placement_group);
          if (pg != groups_.end()) {
            for (size_t b = 0; b < pg->second.info.bundle_nodes.size(); ++b) {
              if (pg->second.info.bundle_nodes[b] != a.rec.info.node) continue;
              if (o.bundle >= 0 && static_cast<int>(b) != o.bundle) continue;
              ResourceMap& used = bundle_used_[{o.placement_group, static_cast<int>(b)}];
              if (!fits_in(pg->second.info.spec.bundles[b].resources, used, o.resources)) continue;
              for (auto& [name, amount] : o.resources) used[name] += amount;
              a.in_bundle = static_cast<int>(b);
              break;
            }
          }
        } else if (node != kNoNode && ledger_.acquire(node, o.resources)) {
          a.holds_on = node;
        }
        w->second.hosted.insert(id);
        // Alive again once its worker is back in touch (AdoptWorker).
        a.rec.info.state = "recovering";
      } else {
        if (a.rec.info.state == "alive") a.rec.info.state = "restarting";
        to_schedule.push_back(id);
      }
      std::string aid = id;
      ClusterActor& stored = actors_.emplace(aid, std::move(a)).first->second;
      watch_owner(stored);
    }
  }
  for (auto& [wid, w] : workers_) {
    watch_worker(w);  // a worker that is gone fails its actors (restarts)
    if (!w.ref) continue;
    std::string worker_id = wid;
    ask<Snapshots>(w.ref, AdoptWorker{self()}, kCreateAsk).then([this, worker_id](Result<Snapshots> r) {
      auto it = workers_.find(worker_id);
      if (it == workers_.end()) return;
      if (!r) return worker_dead(worker_id, "it does not answer the restarted head: " + r.error().message());
      for (auto& [id, bytes] : r->latest) {
        if (actors_.count(id)) (void)store_->put("snap", id, bytes);
      }
      for (const std::string& id : r->hosted) {
        // Made by the old head, never recorded (it died before answering).
        if (!it->second.hosted.count(id)) (void)it->second.ref.tell(StopActor{id});
      }
      std::set<std::string> hosted = it->second.hosted;
      for (const std::string& id : hosted) {
        auto a = actors_.find(id);
        if (a == actors_.end() || a->second.rec.info.state != "recovering") continue;
        a->second.rec.info.state = "alive";
        answer_waiters(a->second, Status());
      }
    });
  }
  for (const std::string& id : to_schedule) {
    // Restarted and pending ones are tried once agents are back.
    pending_actors_.push_back(id);
  }
  // Snapshots of actors that died before the restart: nobody can name them
  // for restore_from any more (the list of the dead is not kept).
  if (auto snaps = store_->all("snap")) {
    std::vector<Store::Change> orphans;
    for (auto& [id, body] : *snaps) {
      if (!actors_.count(id)) orphans.push_back({"snap", id, std::nullopt});
    }
    if (!orphans.empty()) (void)store_->apply(orphans);
  }
  TROUPE_LOG(info, "event=actors_recovered actors={} workers={} to_place={}", actors_.size(), workers_.size(),
             pending_actors_.size());
}

}  // namespace troupe::cluster
