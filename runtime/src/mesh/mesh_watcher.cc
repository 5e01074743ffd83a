// Mesh supervision: a watcher in the owner's process turns the head's actor
// events about a mesh's members into MeshFailure messages for the owner.
#include <map>

#include "cluster/client_state.h"
#include "troupe/mesh.h"

namespace troupe {

namespace {

class MeshWatcher final : public Actor<MeshWatcher, ActorEvent> {
 public:
  MeshWatcher(AnyRef owner, std::map<std::string, size_t> rank_of, Shape full)
      : owner_(std::move(owner)), rank_of_(std::move(rank_of)), full_(std::move(full)) {}

  void on_start() override {
    // The owner gone, nobody is left to tell.
    monitor(owner_, [this](const Down&) { stop(); });
  }

  void handle(const ActorEvent& e) {
    auto it = rank_of_.find(e.id);
    if (it == rank_of_.end() || e.state == "alive") return;
    MeshFailure f;
    f.rank = it->second;
    if (auto index = full_.index_of_rank(f.rank)) f.coords = full_.coords(*index);
    f.actor_id = e.id;
    f.reason = e.reason;
    f.restarting = e.state == "restarting";
    (void)owner_.tell(std::move(f));
    if (e.state == "dead") rank_of_.erase(it);
  }

 private:
  AnyRef owner_;
  std::map<std::string, size_t> rank_of_;
  Shape full_;
};

}  // namespace

Status detail::supervise_mesh(const MeshMembers& members, const AnyRef& owner) {
  if (!owner) return Status(ErrorCode::invalid_argument, "mesh: supervise needs an owner actor");
  if (!members.cluster) return Status(ErrorCode::invalid_argument, "mesh: not a mesh of a cluster");
  std::map<std::string, size_t> rank_of;
  std::vector<std::string> ids;
  for (size_t rank = 0; rank < members.infos.size(); ++rank) {
    rank_of[members.infos[rank].id] = rank;
    ids.push_back(members.infos[rank].id);
  }
  AnyRef watcher = members.cluster->rt->spawn<MeshWatcher>(owner, rank_of, members.full);
  if (!watcher) return Status(ErrorCode::shutting_down, "mesh: the runtime is shutting down");
  Status s = ClusterClient(members.cluster).watch(ids, watcher);
  if (!s.ok()) members.cluster->rt->stop(watcher);
  return s;
}

}  // namespace troupe
