// ProcMesh: one worker process per bundle of a placement group, each held by
// an anchor actor (in a worker process of its own) that the mesh's actors
// are colocated with.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>

#include "log.h"
#include "mesh/proc_anchor.h"
#include "troupe/mesh.h"
#include "troupe/detail/relay.h"
#include "troupe/message.h"
#include "cluster/client_state.h"

namespace troupe {

using mesh::CastGroup;
using mesh::fan_out;
using mesh::MeshCast;
using mesh::ProcAnchor;

void mesh::ProcAnchor::handle(const MeshCast& m) {
  if (m.groups.empty()) return;
  detail::CellControl* me = self().cell();
  for (const cluster::Location& member : m.groups[0].members) {
    auto cell = detail::cell_at(me, member.address, member.id);
    if (cell) (void)detail::tell_encoded(me, cell->get(), m.wire_id, m.bytes);
  }
  fan_out(m.groups, 1, [&](std::vector<CastGroup> subtree) {
    auto next = detail::cell_at(me, subtree[0].anchor.address, subtree[0].anchor.id);
    if (next) (void)AnyRef(std::move(*next)).tell(MeshCast{m.wire_id, m.bytes, std::move(subtree)});
  });
}

namespace {

/// Where the incarnation behind a ref that follows an actor is now.
std::optional<cluster::Location> current_location(Runtime& rt, const AnyRef& followed) {
  detail::Relay* relay = detail::relay_of(followed.cell());
  detail::CellPtr now = relay ? relay->current() : detail::CellPtr();
  if (!now) return std::nullopt;
  auto where = rt.locate(AnyRef(std::move(now)));
  if (!where) return std::nullopt;
  return cluster::Location{where->first, where->second};
}

}  // namespace

namespace {

/// Starts the anchors (one per rank, with these options) and waits for all;
/// on a failure stops those that started.
Result<std::pair<std::vector<ActorInfo>, std::vector<AnyRef>>> start_anchors(const ClusterClient& cluster,
                                                                             const std::vector<ActorOptions>& ranks) {
  std::vector<Future<ActorInfo>> pending;
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    pending.push_back(cluster.spawn_async<ProcAnchor>(ranks[rank], static_cast<uint64_t>(rank)));
  }
  std::vector<ActorInfo> procs;
  std::vector<AnyRef> anchors;
  Status failed;
  for (auto& f : pending) {
    auto info = f.get();
    auto ref = info ? cluster.follow_cell(*info) : Result<detail::CellPtr>(error(info.error()));
    if (ref) {
      procs.push_back(*info);
      anchors.push_back(AnyRef(std::move(*ref)));
    } else if (failed.ok()) {
      failed = Status(ref.error().code(), "proc mesh: a process did not start: " + ref.error().message());
    }
  }
  if (!failed.ok()) {
    for (auto& p : procs) (void)cluster.kill_actor(p.id);
    return error(failed);
  }
  return std::make_pair(std::move(procs), std::move(anchors));
}

}  // namespace

Result<ProcMesh> ProcMesh::create(const ClusterClient& cluster, Shape shape, const std::string& placement_group,
                                  ProcMeshOptions options) {
  auto group = cluster.wait_placement_group(placement_group, options.timeout);
  if (!group) return error(group.error().code(), "proc mesh: " + group.error().message());
  if (group->spec.bundles.size() != shape.size()) {
    return error(ErrorCode::invalid_argument,
                 "proc mesh: shape " + shape.to_string() + " has " + std::to_string(shape.size()) +
                     " processes but placement group " + placement_group + " has " +
                     std::to_string(group->spec.bundles.size()) + " bundles (one process per bundle)");
  }
  std::vector<ActorOptions> ranks(shape.size());
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    ranks[rank].placement_group = placement_group;
    ranks[rank].bundle = static_cast<int>(rank);
    ranks[rank].max_restarts = options.max_restarts;
    ranks[rank].dedicated_process = true;
  }
  auto started = start_anchors(cluster, ranks);
  if (!started) return error(started.error());
  return ProcMesh(cluster, std::move(shape), std::move(started->first), std::move(started->second));
}

Result<ProcMesh> ProcMesh::create_on_nodes(const ClusterClient& cluster, Shape shape,
                                           const std::vector<std::string>& nodes, ProcMeshOptions options) {
  if (nodes.size() != shape.size()) {
    return error(ErrorCode::invalid_argument, "proc mesh: shape " + shape.to_string() + " has " +
                                                  std::to_string(shape.size()) + " processes but " +
                                                  std::to_string(nodes.size()) + " nodes were given (one per process)");
  }
  std::vector<ActorOptions> ranks(shape.size());
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    ranks[rank].label_selector = {LabelCondition{kNodeLabel, {nodes[rank]}, false}};
    ranks[rank].max_restarts = options.max_restarts;
    ranks[rank].dedicated_process = true;
  }
  auto started = start_anchors(cluster, ranks);
  if (!started) return error(started.error());
  return ProcMesh(cluster, std::move(shape), std::move(started->first), std::move(started->second));
}

Status detail::mesh_cast(const MeshMembers& members, const Shape& view, MessageBox box) {
  if (view.size() == 0) return {};
  CellControl* context = members.refs[view.rank(0)].cell();
  auto encoded = encode_message(context, box);
  if (!encoded) return encoded.error();
  auto& [wire_id, bytes] = *encoded;
  Runtime& rt = *members.cluster->rt;
  // The view's members by process, each with where its incarnation is now;
  // members (or processes) between incarnations get it through their refs,
  // which hold it until they are back.
  std::map<size_t, std::vector<size_t>> by_process;
  for (size_t i = 0; i < view.size(); ++i) by_process[members.process_of[view.rank(i)]].push_back(view.rank(i));
  std::vector<CastGroup> groups;
  std::vector<size_t> group_process;
  Status first;
  auto direct = [&](size_t rank) {
    Status s = tell_encoded(context, members.refs[rank].cell(), wire_id, bytes);
    if (!s.ok() && first.ok()) first = s;
  };
  for (auto& [process, ranks] : by_process) {
    auto anchor = current_location(rt, members.anchors[process]);
    CastGroup g;
    for (size_t rank : ranks) {
      auto at = anchor ? current_location(rt, members.refs[rank]) : std::nullopt;
      if (at) {
        g.members.push_back(*at);
      } else {
        direct(rank);
      }
    }
    if (g.members.empty()) continue;
    g.anchor = *anchor;
    groups.push_back(std::move(g));
    group_process.push_back(process);
  }
  size_t offset = 0;
  fan_out(groups, 0, [&](std::vector<CastGroup> subtree) {
    size_t root = group_process[offset];
    offset += subtree.size();
    Status s = members.anchors[root].tell(MeshCast{wire_id, bytes, std::move(subtree)});
    if (!s.ok() && first.ok()) first = s;
  });
  return first;
}

namespace {

/// The distinct processes of the group's ranks (their anchors), each once,
/// in rank order. Two meshes on one ProcMesh share its anchors' refs, so a
/// process that holds a rank of each counts once.
std::vector<AnyRef> group_processes(const GroupRanks& ranks) {
  std::vector<AnyRef> processes;
  for (const AnyRef& a : ranks.anchors) {
    if (std::find(processes.begin(), processes.end(), a) == processes.end()) processes.push_back(a);
  }
  return processes;
}

/// Lays the group out over hosts and makes each host's arena: asks every
/// process which host it is on (collectives/host_id.h), makes an arena in
/// the first process of each host with more than one rank and maps it in
/// that host's other processes. Returns each rank's host number, or nothing
/// (no arenas: the flat ring) when no host has two ranks or one cannot make
/// or map its arena.
std::vector<uint32_t> set_up_arenas(const GroupRanks& ranks, const CollectiveGroup& spec,
                                    std::chrono::milliseconds timeout) {
  std::vector<AnyRef> processes = group_processes(ranks);
  std::vector<Future<std::string>> asked;
  for (const AnyRef& p : processes) asked.push_back(p.ask<std::string>(mesh::AnchorHost{}, timeout));
  std::vector<uint32_t> host_of_process(processes.size());  // by index in `processes`
  std::vector<std::string> host_names;
  for (size_t k = 0; k < processes.size(); ++k) {
    auto host = asked[k].get();
    if (!host) {
      TROUPE_LOG(info, "event=collective_arena_unavailable group={} reason=\"{}\"", spec.id, host.error().message());
      return {};
    }
    auto known = std::find(host_names.begin(), host_names.end(), *host);
    host_of_process[k] = static_cast<uint32_t>(known - host_names.begin());
    if (known == host_names.end()) host_names.push_back(*host);
  }
  auto process_index = [&](const AnyRef& a) {
    return static_cast<size_t>(std::find(processes.begin(), processes.end(), a) - processes.begin());
  };
  const size_t size = ranks.anchors.size();
  std::vector<uint32_t> hosts(size);
  std::vector<uint32_t> ranks_on(host_names.size(), 0);
  for (size_t i = 0; i < size; ++i) ++ranks_on[hosts[i] = host_of_process[process_index(ranks.anchors[i])]];
  if (std::all_of(ranks_on.begin(), ranks_on.end(), [](uint32_t n) { return n == 1; })) return {};
  // One arena per host with two ranks or more, in its first process.
  std::vector<std::pair<size_t, Future<collectives::SlotsOffer>>> made;  // (host, offer)
  for (size_t h = 0; h < host_names.size(); ++h) {
    if (ranks_on[h] < 2) continue;
    size_t first = static_cast<size_t>(std::find(host_of_process.begin(), host_of_process.end(), h) -
                                       host_of_process.begin());
    made.emplace_back(h, processes[first].ask<collectives::SlotsOffer>(
                             mesh::MakeArena{spec.id, ranks_on[h], spec.chunk_bytes}, timeout));
  }
  std::vector<Future<void>> opened;
  bool all = true;
  for (auto& [h, f] : made) {
    auto offer = f.get();
    if (!offer) {
      TROUPE_LOG(info, "event=collective_arena_unavailable group={} reason=\"{}\"", spec.id, offer.error().message());
      all = false;
      continue;
    }
    bool first = true;
    for (size_t k = 0; k < processes.size(); ++k) {
      if (host_of_process[k] != h || std::exchange(first, false)) continue;
      opened.push_back(processes[k].ask<void>(mesh::OpenArena{spec.id, ranks_on[h], *offer}, timeout));
    }
  }
  for (auto& f : opened) {
    if (auto r = f.get(); !r) {
      // Not where its host id says (no access to /proc, say): the ring
      // still works there.
      TROUPE_LOG(info, "event=collective_arena_unreachable group={} reason=\"{}\"", spec.id, r.error().message());
      all = false;
    }
  }
  if (!all) return {};
  return hosts;
}

}  // namespace

GroupRanks detail::group_ranks(const MeshMembers& members, const Shape& view) {
  GroupRanks ranks;
  ranks.cluster = members.cluster;
  for (size_t i = 0; i < view.size(); ++i) ranks.anchors.push_back(members.anchors[members.process_of[view.rank(i)]]);
  return ranks;
}

Result<std::vector<CollectiveGroup>> make_group(const std::vector<GroupRanks>& parts, const GroupOptions& options) {
  GroupRanks ranks;
  for (const GroupRanks& part : parts) {
    if (!part.cluster) return error(ErrorCode::invalid_argument, "collectives: a part of the group is empty (made how?)");
    if (!ranks.cluster) ranks.cluster = part.cluster;
    if (part.cluster->rt != ranks.cluster->rt) {
      return error(ErrorCode::invalid_argument,
                   "collectives: the group's meshes belong to different clusters' clients; make them from one");
    }
    ranks.anchors.insert(ranks.anchors.end(), part.anchors.begin(), part.anchors.end());
  }
  if (ranks.anchors.empty()) return error(ErrorCode::invalid_argument, "collectives: a group needs one rank at least");
  auto timeout = options.timeout;
  static std::atomic<uint64_t> counter{0};
  Runtime& rt = *ranks.cluster->rt;
  CollectiveGroup spec;
  spec.id = "group-" + std::to_string(getpid()) + "-" + std::to_string(++counter) + "-" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  spec.size = static_cast<uint32_t>(ranks.anchors.size());
  spec.timeout_ms = timeout.count();
  spec.shared_memory = options.shared_memory;
  spec.chunk_bytes = options.chunk_bytes;
  if (options.pipeline_pieces < 1 || options.pipeline_pieces > kMaxPipelinePieces) {
    return error(ErrorCode::invalid_argument, "collectives: pipeline_pieces " +
                                                  std::to_string(options.pipeline_pieces) + " is outside [1, " +
                                                  std::to_string(kMaxPipelinePieces) + "] (1: no pipelining)");
  }
  spec.pipeline_pieces = options.pipeline_pieces;
  for (size_t i = 0; i < ranks.anchors.size(); ++i) {
    auto at = current_location(rt, ranks.anchors[i]);
    if (!at) {
      return error(ErrorCode::actor_dead, "collectives: the process of rank " + std::to_string(i) +
                                              " is between incarnations; make the group once it is back");
    }
    spec.engines.push_back(EngineAt{at->address, at->id});
  }
  std::vector<uint32_t> hosts;
  if (options.shared_memory && options.host_arena && spec.size > 1) hosts = set_up_arenas(ranks, spec, timeout);
  std::vector<CollectiveGroup> handles;
  std::vector<Future<void>> joined;
  for (size_t i = 0; i < ranks.anchors.size(); ++i) {
    CollectiveGroup h = spec;
    h.rank = static_cast<uint32_t>(i);
    joined.push_back(ranks.anchors[i].ask<void>(mesh::JoinGroup{h, hosts}, timeout));
    handles.push_back(std::move(h));
  }
  for (auto& f : joined) {
    if (auto r = f.get(); !r) return error(r.error().code(), "collectives: " + r.error().message());
  }
  return handles;
}

Status release_group(const std::vector<GroupRanks>& parts, const CollectiveGroup& group) {
  const std::string& id = group.id;
  std::vector<AnyRef> processes;
  for (const GroupRanks& part : parts) {
    for (const AnyRef& p : group_processes(part)) {
      if (std::find(processes.begin(), processes.end(), p) == processes.end()) processes.push_back(p);
    }
  }
  std::vector<Future<void>> left;
  for (const AnyRef& p : processes) left.push_back(p.ask<void>(mesh::LeaveGroup{id}, std::chrono::seconds(10)));
  Status first;
  for (auto& f : left) {
    auto r = f.get();
    if (r || r.error().code() == ErrorCode::peer_lost || r.error().code() == ErrorCode::actor_dead) continue;
    if (first.ok()) first = Status(r.error().code(), "collectives: releasing group " + id + ": " + r.error().message());
  }
  return first;
}

Status ProcMesh::stop() const {
  Status first;
  for (auto& p : procs_) {
    Status s = cluster_.kill_actor(p.id);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

}  // namespace troupe
