// ProcMesh: one worker process per bundle of a placement group, each held by
// an anchor actor (in a worker process of its own) that the mesh's actors
// are colocated with.
#include <unistd.h>

#include "troupe/mesh.h"
#include "troupe/message.h"

namespace troupe {

namespace {

struct AnchorPid {
  TROUPE_MESSAGE_NAMED(AnchorPid, "troupe.mesh.AnchorPid");
};

/// Holds a mesh process: the head keeps it (and restarts it), and the
/// mesh's actors go where it is.
class ProcAnchor final : public Actor<ProcAnchor, AnchorPid> {
 public:
  explicit ProcAnchor(uint64_t rank) : rank_(rank) {}
  int64_t handle(const AnchorPid&) { return getpid(); }

 private:
  uint64_t rank_;
};

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
  std::vector<Future<ActorInfo>> pending;
  for (size_t rank = 0; rank < shape.size(); ++rank) {
    ActorOptions o;
    o.placement_group = placement_group;
    o.bundle = static_cast<int>(rank);
    o.max_restarts = options.max_restarts;
    o.dedicated_process = true;
    pending.push_back(cluster.spawn_async<ProcAnchor>(o, static_cast<uint64_t>(rank)));
  }
  std::vector<ActorInfo> procs;
  Status failed;
  for (auto& f : pending) {
    auto info = f.get();
    if (info) {
      procs.push_back(*info);
    } else if (failed.ok()) {
      failed = Status(info.error().code(), "proc mesh: a process did not start: " + info.error().message());
    }
  }
  if (!failed.ok()) {
    for (auto& p : procs) (void)cluster.kill_actor(p.id);
    return error(failed);
  }
  return ProcMesh(cluster, std::move(shape), std::move(procs));
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
