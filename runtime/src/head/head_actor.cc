#include "head_actor.h"

#include <algorithm>
#include <random>

#include "log.h"

namespace troupe::cluster {

namespace {

using Clock = std::chrono::steady_clock;

Status check_spec(const PlacementGroupSpec& spec) {
  if (spec.bundles.empty()) {
    return Status(ErrorCode::invalid_argument, "placement group: it needs at least one bundle");
  }
  for (size_t i = 0; i < spec.bundles.size(); ++i) {
    bool any = false;
    for (auto& [name, amount] : spec.bundles[i].resources) {
      if (!(amount >= 0)) {
        return Status(ErrorCode::invalid_argument, "placement group: bundle " + std::to_string(i) + " asks for " +
                                                       std::to_string(amount) + " " + name + " (must be >= 0)");
      }
      any |= amount > 0;
    }
    if (!any) {
      return Status(ErrorCode::invalid_argument, "placement group: bundle " + std::to_string(i) +
                                                     " asks for no resources (give at least one amount > 0)");
    }
  }
  return {};
}

}  // namespace

HeadActor::HeadActor(std::shared_ptr<Store> store, HeadConfig config)
    : store_(std::move(store)), config_(std::move(config)) {}

void HeadActor::on_start() {
  load();
  after(config_.heartbeat / 2, [this] { tick(); });
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s-%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buf;
}

namespace {
int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

std::string HeadActor::new_group_id() { return random_id("pg"); }

Status HeadActor::persist_job(const JobInfo& j) { return store_->put("job", j.id, codec::encode(j)); }

Status HeadActor::persist_node(const Node& n) { return store_->put("node", n.info.id, codec::encode(n.info)); }

Status HeadActor::persist_group(const Group& g) { return store_->put("pg", g.info.id, codec::encode(g.info)); }

void HeadActor::load() {
  auto now = Clock::now();
  if (auto nodes = store_->all("node")) {
    for (auto& [id, body] : *nodes) {
      auto info = codec::decode<NodeInfo>(body);
      if (!info) {
        TROUPE_LOG(err, "event=store_record_unreadable kind=node id={} reason=\"{}\"", id, info.error().message());
        continue;
      }
      if (info->state != "alive") continue;  // dead nodes come back by registering
      Node n;
      n.info = std::move(*info);
      n.info.connected = false;
      // Known alive before the restart: it has dead_after to beat again.
      n.index = ledger_.add_node(n.info.id, n.info.total, n.info.labels);
      n.last_heard = now;
      nodes_.emplace(id, std::move(n));
    }
  } else {
    TROUPE_LOG(err, "event=store_read_failed kind=node reason=\"{}\"", nodes.error().message());
  }
  if (auto groups = store_->all("pg")) {
    for (auto& [id, body] : *groups) {
      auto info = codec::decode<PlacementGroupInfo>(body);
      if (!info) {
        TROUPE_LOG(err, "event=store_record_unreadable kind=pg id={} reason=\"{}\"", id, info.error().message());
        continue;
      }
      Group g;
      g.info = std::move(*info);
      if (!g.info.spec.name.empty()) group_names_[g.info.spec.name] = id;
      if (!g.info.request_id.empty()) group_requests_[g.info.request_id] = id;
      if (g.info.state == "pending") {
        pending_.push_back(id);
      } else {
        std::vector<NodeIndex> where;
        for (auto& node : g.info.bundle_nodes) where.push_back(node.empty() ? kNoNode : ledger_.find_node(node));
        if (!ledger_.restore(id, g.info.spec, where)) {
          g.info.state = "pending";
          g.info.bundle_nodes.assign(g.info.spec.bundles.size(), "");
          pending_.push_back(id);
        } else {
          auto now_on = ledger_.placement(id);
          if (std::count(now_on.begin(), now_on.end(), kNoNode) > 0) {
            g.info.state = "rescheduling";
            pending_.insert(pending_.begin(), id);
          }
        }
      }
      groups_.emplace(id, std::move(g));
    }
  } else {
    TROUPE_LOG(err, "event=store_read_failed kind=pg reason=\"{}\"", groups.error().message());
  }
  if (auto names = store_->all("name")) {
    for (auto& [key, body] : *names) {
      auto entry = codec::decode<NamedActor>(body);
      if (!entry || !add_name(*entry).ok()) (void)store_->erase("name", key);  // its actor is gone
    }
  }
  if (auto jobs = store_->all("job")) {
    for (auto& [id, body] : *jobs) {
      if (auto j = codec::decode<JobInfo>(body)) jobs_.emplace(id, std::move(*j));
    }
  }
  TROUPE_LOG(info, "event=head_recovered nodes={} placement_groups={} pending={} jobs={}", nodes_.size(),
             groups_.size(), pending_.size(), jobs_.size());
  load_actors();
  place_pending();
}

Result<Registered> HeadActor::handle(const RegisterNode& m) {
  if (m.node_id.empty()) return error(ErrorCode::invalid_argument, "register: empty node id");
  auto it = nodes_.find(m.node_id);
  bool known_alive = it != nodes_.end() && it->second.info.state == "alive" && it->second.info.total == m.resources;
  // Every node carries its id as a label, so that a selector can name it
  // ("troupe.node=a1": a process of a mesh on that node).
  Labels labels = m.labels;
  labels.emplace(kNodeLabel, m.node_id);
  Node& n = nodes_[m.node_id];
  if (!known_alive) {
    // New, dead before, or changed: its resources start free (whatever it
    // held was rescheduled when it died).
    n.index = ledger_.add_node(m.node_id, m.resources, labels);
  }
  n.info.id = m.node_id;
  n.info.address = m.address;
  n.info.total = m.resources;
  n.info.labels = labels;
  n.info.state = "alive";
  n.info.connected = true;
  n.last_heard = Clock::now();
  if (n.monitor != 0) demonitor(n.monitor);
  n.agent = m.agent;
  if (m.agent) {
    std::string id = m.node_id;
    n.monitor = monitor(m.agent, [this, id](const Down& d) {
      node_dead(id, "its agent is gone (" + d.reason.to_string() + ")");
    });
  }
  if (Status s = persist_node(n); !s.ok()) return error(s);
  TROUPE_LOG(info, "event=node_registered node={} address={} resources={} rejoined={}", m.node_id, m.address,
             m.resources.size(), known_alive);
  place_pending();
  return Registered{config_.heartbeat.count()};
}

Result<bool> HeadActor::handle(const NodeHeartbeat& m) {
  auto it = nodes_.find(m.node_id);
  if (it == nodes_.end() || it->second.info.state != "alive") return false;  // register again
  it->second.last_heard = Clock::now();
  return true;
}

Result<std::string> HeadActor::handle(const CreatePlacementGroup& m) {
  if (!m.request_id.empty()) {
    // A retry of a request this head (or its predecessor) already did.
    if (auto it = group_requests_.find(m.request_id); it != group_requests_.end()) return it->second;
  }
  if (Status s = check_spec(m.spec); !s.ok()) return error(s);
  if (!m.spec.name.empty() && group_names_.count(m.spec.name)) {
    return error(ErrorCode::already_exists, "placement group: the name '" + m.spec.name + "' is taken (by " +
                                                group_names_[m.spec.name] + ")");
  }
  Group g;
  g.info.id = new_group_id();
  g.info.spec = m.spec;
  g.info.request_id = m.request_id;
  g.info.bundle_nodes.assign(m.spec.bundles.size(), "");
  auto out = ledger_.place(g.info.id, m.spec);
  if (out.placed) {
    g.info.state = "created";
    for (size_t b = 0; b < out.nodes.size(); ++b) g.info.bundle_nodes[b] = ledger_.node(out.nodes[b]).id;
  } else {
    g.info.state = "pending";
    g.info.reason = out.reason;
  }
  if (Status s = persist_group(g); !s.ok()) {
    ledger_.release(g.info.id);
    return error(s);
  }
  std::string id = g.info.id;
  if (!m.spec.name.empty()) group_names_[m.spec.name] = id;
  if (!m.request_id.empty()) group_requests_[m.request_id] = id;
  if (!out.placed) pending_.push_back(id);
  groups_.emplace(id, std::move(g));
  return id;
}

Deferred<PlacementGroupInfo> HeadActor::handle(const WaitPlacementGroup& m) {
  auto reply = defer<PlacementGroupInfo>();
  auto it = groups_.find(m.id);
  if (it == groups_.end()) {
    reply.fail(Status(ErrorCode::not_found, "placement group " + m.id + " does not exist (removed?)"));
  } else if (it->second.info.state == "created") {
    reply.complete(it->second.info);
  } else {
    it->second.waiters.push_back(Waiter{reply, Clock::now() + std::chrono::milliseconds(m.timeout_ms)});
  }
  return reply;
}

Result<void> HeadActor::handle(const RemovePlacementGroup& m) {
  auto it = groups_.find(m.id);
  if (it == groups_.end()) return error(ErrorCode::not_found, "placement group " + m.id + " does not exist");
  if (Status s = store_->erase("pg", m.id); !s.ok()) return error(s);
  stop_group_actors(m.id);
  ledger_.release(m.id);
  for (auto& w : it->second.waiters) {
    w.reply.fail(Status(ErrorCode::not_found, "placement group " + m.id + " was removed while waited for"));
  }
  if (!it->second.info.spec.name.empty()) group_names_.erase(it->second.info.spec.name);
  if (!it->second.info.request_id.empty()) group_requests_.erase(it->second.info.request_id);
  groups_.erase(it);
  pending_.erase(std::remove(pending_.begin(), pending_.end(), m.id), pending_.end());
  place_pending();
  return {};
}

ClusterStatus HeadActor::handle(const GetClusterStatus&) {
  ClusterStatus st;
  st.head_address = config_.address;
  auto now = Clock::now();
  for (auto& [id, n] : nodes_) {
    NodeInfo info = n.info;
    if (n.index != kNoNode && info.state == "alive") info.free = ledger_.free_of(n.index);
    info.silent_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - n.last_heard).count();
    st.nodes.push_back(std::move(info));
  }
  for (auto& [id, g] : groups_) st.placement_groups.push_back(g.info);
  for (auto& [id, j] : jobs_) st.jobs.push_back(j);
  for (auto& [key, n] : names_) st.named_actors.push_back(n.entry);
  for (auto& [id, a] : actors_) {
    ++st.actors_by_state[a.rec.info.state];
    if (a.rec.info.state != "alive") st.actors.push_back(a.rec.info);
  }
  if (!dead_actors_.empty()) st.actors_by_state["dead"] = static_cast<int64_t>(dead_actors_.size());
  st.actors.insert(st.actors.end(), dead_actors_.begin(), dead_actors_.end());
  return st;
}

Status HeadActor::add_name(const NamedActor& entry) {
  if (!config_.ref_at) return Status(ErrorCode::unsupported, "names: this head cannot reach actors");
  auto ref = config_.ref_at(entry.address, entry.id);
  if (!ref) return ref.error();
  std::string key = entry.ns + "/" + entry.name;
  Named& n = names_[key];
  n.entry = entry;
  n.monitor = monitor(*ref, [this, key, entry](const Down&) {
    auto it = names_.find(key);
    if (it == names_.end() || it->second.entry.address != entry.address || it->second.entry.id != entry.id) return;
    names_.erase(it);
    (void)store_->erase("name", key);
    TROUPE_LOG(info, "event=name_freed ns={} name={} reason=\"its actor stopped\"", entry.ns, entry.name);
  });
  return {};
}

Result<NamedActor> HeadActor::handle(const RegisterName& m) {
  if (m.entry.name.empty()) return error(ErrorCode::invalid_argument, "names: empty name");
  std::string key = m.entry.ns + "/" + m.entry.name;
  if (auto it = names_.find(key); it != names_.end()) return it->second.entry;  // the first one won
  if (Status s = store_->put("name", key, codec::encode(m.entry)); !s.ok()) return error(s);
  if (Status s = add_name(m.entry); !s.ok()) {
    (void)store_->erase("name", key);
    return error(s);
  }
  return m.entry;
}

Deferred<NamedActor> HeadActor::handle(const LookupName& m) {
  auto reply = defer<NamedActor>();
  auto it = names_.find(m.ns + "/" + m.name);
  if (it == names_.end()) {
    reply.fail(Status(ErrorCode::not_found, "names: no actor is named '" + m.name + "' in namespace '" + m.ns + "'"));
    return reply;
  }
  auto a = it->second.actor_id.empty() ? actors_.end() : actors_.find(it->second.actor_id);
  if (a == actors_.end() || a->second.rec.info.state == "alive") {
    reply.complete(it->second.entry);
    return reply;
  }
  // An actor of the cluster between incarnations: answer once it is back.
  NamedActor entry = it->second.entry;
  a->second.waiters.push_back(ActorWaiter{[reply, entry](const ActorInfo& info, const Status& s) mutable {
                                            if (!s.ok()) return reply.fail(s);
                                            entry.address = info.address;
                                            entry.id = info.ref_id;
                                            reply.complete(entry);
                                          },
                                          Clock::now() + std::chrono::seconds(10)});
  return reply;
}

Result<void> HeadActor::handle(const UnregisterName& m) {
  std::string key = m.ns + "/" + m.name;
  auto it = names_.find(key);
  if (it == names_.end()) return {};
  if (Status s = store_->erase("name", key); !s.ok()) return error(s);
  if (it->second.monitor != 0) demonitor(it->second.monitor);
  names_.erase(it);
  return {};
}

HeadActor::Node* HeadActor::node_for_job(const std::string& wanted, std::string* why) {
  if (!wanted.empty()) {
    auto it = nodes_.find(wanted);
    if (it == nodes_.end() || it->second.info.state != "alive" || !it->second.agent) {
      *why = "node " + wanted + " is not alive in this cluster (troupe list nodes)";
      return nullptr;
    }
    return &it->second;
  }
  std::vector<Node*> alive;
  for (auto& [id, n] : nodes_) {
    if (n.info.state == "alive" && n.agent) alive.push_back(&n);
  }
  if (alive.empty()) {
    *why = "no node is alive to run it (start one with troupe start --address ...)";
    return nullptr;
  }
  return alive[next_job_node_++ % alive.size()];
}

Deferred<std::string> HeadActor::handle(const SubmitJob& m) {
  auto reply = defer<std::string>();
  if (m.command.empty()) {
    reply.fail(Status(ErrorCode::invalid_argument, "job: no command (troupe job submit -- CMD ...)"));
    return reply;
  }
  std::string why;
  Node* node = node_for_job(m.node, &why);
  if (node == nullptr) {
    reply.fail(Status(ErrorCode::not_found, "job: " + why));
    return reply;
  }
  JobInfo job;
  job.id = random_id("job");
  job.command = m.command;
  job.node = node->info.id;
  job.state = "running";
  job.submitted_ms = wall_ms();
  std::string id = job.id;
  ask<void>(node->agent, RunJob{id, m.command, m.env, self()}).then([this, reply, job](Result<void> r) mutable {
    if (!r) {
      job.state = "failed";
      job.message = r.error().message();
      job.ended_ms = wall_ms();
    }
    if (Status s = persist_job(job); !s.ok()) {
      reply.fail(s);
      return;
    }
    jobs_[job.id] = job;
    r ? reply.complete(job.id) : reply.fail(r.error());
  });
  return reply;
}

Result<JobInfo> HeadActor::handle(const GetJob& m) {
  auto it = jobs_.find(m.id);
  if (it == jobs_.end()) return error(ErrorCode::not_found, "job " + m.id + " does not exist (troupe status)");
  return it->second;
}

void HeadActor::handle(const JobEnded& m) {
  auto it = jobs_.find(m.id);
  if (it == jobs_.end() || it->second.state != "running") return;
  JobInfo& j = it->second;
  j.exit_code = m.exit_code;
  j.state = m.stopped ? "stopped" : m.exit_code == 0 ? "succeeded" : "failed";
  j.ended_ms = wall_ms();
  (void)persist_job(j);
}

Deferred<std::string> HeadActor::handle(const ReadJobLog& m) {
  auto reply = defer<std::string>();
  auto it = jobs_.find(m.id);
  auto node = it == jobs_.end() ? nodes_.end() : nodes_.find(it->second.node);
  if (node == nodes_.end() || !node->second.agent || node->second.info.state != "alive") {
    reply.fail(Status(ErrorCode::not_found, it == jobs_.end() ? "job " + m.id + " does not exist"
                                                              : "job " + m.id + ": its node " + it->second.node +
                                                                    " is gone, and its log with it"));
    return reply;
  }
  ask<std::string>(node->second.agent, m).then([reply](Result<std::string> r) mutable {
    r ? reply.complete(std::move(*r)) : reply.fail(r.error());
  });
  return reply;
}

Deferred<void> HeadActor::handle(const StopJob& m) {
  auto reply = defer<void>();
  auto it = jobs_.find(m.id);
  if (it == jobs_.end()) {
    reply.fail(Status(ErrorCode::not_found, "job " + m.id + " does not exist"));
    return reply;
  }
  auto node = nodes_.find(it->second.node);
  if (it->second.state != "running" || node == nodes_.end() || !node->second.agent) {
    reply.complete();  // already over
    return reply;
  }
  ask<void>(node->second.agent, m).then([reply](Result<void> r) mutable {
    r ? reply.complete() : reply.fail(r.error());
  });
  return reply;
}

void HeadActor::tick() {
  auto now = Clock::now();
  std::vector<std::pair<std::string, int64_t>> silent;
  for (auto& [id, n] : nodes_) {
    auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - n.last_heard);
    if (n.info.state == "alive" && quiet > config_.dead_after) silent.emplace_back(id, quiet.count());
  }
  for (auto& [id, ms] : silent) {
    node_dead(id, "no heartbeat for " + std::to_string(ms) + " ms (bound " +
                      std::to_string(config_.dead_after.count()) + " ms): hung, partitioned or gone");
  }
  for (auto& [id, g] : groups_) {
    auto& ws = g.waiters;
    for (auto w = ws.begin(); w != ws.end();) {
      if (w->deadline <= now) {
        w->reply.fail(Status(ErrorCode::timeout, "placement group " + id + " is still " + g.info.state + ": " +
                                                     g.info.reason));
        w = ws.erase(w);
      } else {
        ++w;
      }
    }
  }
  expire_actor_waiters(now);
  after(config_.heartbeat / 2, [this] { tick(); });
}

void HeadActor::handle(const LeaveNode& m) { node_dead(m.node_id, "it left (its agent stopped)", true); }

void HeadActor::node_dead(const std::string& id, const std::string& why, bool left) {
  auto it = nodes_.find(id);
  if (it == nodes_.end() || it->second.info.state != "alive") return;
  Node& n = it->second;
  n.info.state = "dead";
  if (n.monitor != 0) demonitor(n.monitor);
  n.monitor = 0;
  if (left) {
    TROUPE_LOG(info, "event=node_left node={}", id);
  } else {
    TROUPE_LOG(warn, "event=node_dead node={} reason=\"{}\"", id, why);
  }
  (void)persist_node(n);
  for (auto& [jid, j] : jobs_) {
    if (j.node != id || j.state != "running") continue;
    j.state = "failed";
    j.message = "its node died: " + why;
    j.ended_ms = wall_ms();
    (void)persist_job(j);
  }
  for (const std::string& gid : ledger_.remove_node(n.index)) {
    auto g = groups_.find(gid);
    if (g == groups_.end()) continue;
    g->second.info.state = "rescheduling";
    g->second.info.reason = "node " + id + " died: " + why;
    for (auto& node : g->second.info.bundle_nodes) {
      if (node == id) node.clear();
    }
    (void)persist_group(g->second);
    pending_.erase(std::remove(pending_.begin(), pending_.end(), gid), pending_.end());
    pending_.insert(pending_.begin(), gid);  // before new groups
  }
  // Its workers went with it: their actors restart elsewhere (or wait for
  // their bundles' new place).
  std::vector<std::string> lost;
  for (auto& [wid, w] : workers_) {
    if (w.rec.node == id) lost.push_back(wid);
  }
  for (const std::string& wid : lost) worker_dead(wid, "its node " + id + " died: " + why);
  place_pending();
}

void HeadActor::place_pending() {
  std::vector<std::string> still;
  for (const std::string& id : pending_) {
    auto it = groups_.find(id);
    if (it == groups_.end()) continue;
    Group& g = it->second;
    PlaceOutcome out = g.info.state == "rescheduling" ? ledger_.reschedule(id) : ledger_.place(id, g.info.spec);
    if (out.placed) {
      placed(g, out.nodes);
    } else {
      g.info.reason = out.reason;
      still.push_back(id);
    }
  }
  pending_ = std::move(still);
  place_pending_actors();  // after the groups: actors may wait for their bundles
}

void HeadActor::placed(Group& g, const std::vector<NodeIndex>& nodes) {
  g.info.state = "created";
  g.info.reason.clear();
  for (size_t b = 0; b < nodes.size() && b < g.info.bundle_nodes.size(); ++b) {
    g.info.bundle_nodes[b] = ledger_.node(nodes[b]).id;
  }
  if (Status s = persist_group(g); !s.ok()) {
    TROUPE_LOG(err, "event=store_write_failed kind=pg id={} reason=\"{}\"", g.info.id, s.message());
  }
  TROUPE_LOG(debug, "event=placement_group_created id={}", g.info.id);
  for (auto& w : g.waiters) w.reply.complete(g.info);
  g.waiters.clear();
}

}  // namespace troupe::cluster
