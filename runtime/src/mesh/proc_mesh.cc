// ProcMesh: one worker process per bundle of a placement group, each held by
// an anchor actor (in a worker process of its own) that the mesh's actors
// are colocated with.
#include <unistd.h>

#include <map>
#include <optional>

#include "troupe/mesh.h"
#include "troupe/detail/relay.h"
#include "troupe/message.h"
#include "cluster/client_state.h"

namespace troupe {

namespace {

struct AnchorPid {
  TROUPE_MESSAGE_NAMED(AnchorPid, "troupe.mesh.AnchorPid");
};

/// The members of one process that a cast is for.
struct CastGroup {
  cluster::Location anchor;
  std::vector<cluster::Location> members;
  TROUPE_FIELDS(anchor, members);
};
/// A cast on its way down the tree: groups[0] is the receiver's own; it
/// forwards the rest, split among a few others, each of which does the same.
struct MeshCast {
  uint64_t wire_id = 0;
  std::string bytes;
  std::vector<CastGroup> groups;
  TROUPE_MESSAGE_NAMED(MeshCast, "troupe.mesh.Cast", wire_id, bytes, groups);
};

/// How many others each hop sends to: depth log4(n) for n processes.
constexpr size_t kCastFanout = 4;

/// Splits `groups[from..]` into up to kCastFanout contiguous subtrees and
/// hands each to `send(subtree)`, whose first group is the subtree's root.
template <class Send>
void fan_out(const std::vector<CastGroup>& groups, size_t from, Send&& send) {
  size_t n = groups.size() - from;
  size_t parts = std::min(n, kCastFanout);
  for (size_t k = 0; k < parts; ++k) {
    size_t begin = from + k * n / parts, end = from + (k + 1) * n / parts;
    send(std::vector<CastGroup>(groups.begin() + static_cast<std::ptrdiff_t>(begin),
                                groups.begin() + static_cast<std::ptrdiff_t>(end)));
  }
}

/// Holds a mesh process: the head keeps it (and restarts it), the mesh's
/// actors go where it is, and casts pass through it.
class ProcAnchor final : public Actor<ProcAnchor, AnchorPid, MeshCast> {
 public:
  /// `rank`: its place in the mesh, shown in the actor table.
  explicit ProcAnchor(uint64_t rank) { (void)rank; }
  int64_t handle(const AnchorPid&) { return getpid(); }

  void handle(const MeshCast& m) {
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
};

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

Status ProcMesh::stop() const {
  Status first;
  for (auto& p : procs_) {
    Status s = cluster_.kill_actor(p.id);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

}  // namespace troupe
