// Actor meshes (Monarch's): processes laid out in a named shape, one actor
// of a class per process, and messages to all of a mesh (or a slice of it)
// at once.
//
//   auto pg = cluster.create_placement_group({.bundles = std::vector(8, Bundle{{{"CPU", 1}}})}).value();
//   auto procs = ProcMesh::create(cluster, Shape::make({{"hosts", 2}, {"procs", 4}}).value(), pg).value();
//   auto trainers = procs.spawn<Trainer>({.max_restarts = -1}, config).value();   // ActorMesh<Trainer>
//   ValueMesh<float> losses = trainers.call(Step{});                              // every member's reply
//   trainers.slice({{"hosts", 0}}).value().cast(Sync{});                          // fire and forget
//
// Each process of a ProcMesh is a worker of its own in one bundle of a
// placement group, anchored by a small actor; the actors of an ActorMesh are
// colocated with the anchors, so that a restarted process brings its actors
// back at their coordinates. See docs/meshes.md.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/cluster.h"
#include "troupe/collective_group.h"
#include "troupe/mesh_shape.h"

namespace troupe {

/// Every member's reply to a call, in view order, with the view's shape:
/// partial results when some members failed.
template <class R>
class ValueMesh {
 public:
  ValueMesh(Shape shape, std::vector<Result<R>> values) : shape_(std::move(shape)), values_(std::move(values)) {}

  const Shape& shape() const { return shape_; }
  size_t size() const { return values_.size(); }
  /// The reply of the member at view index `index` (its global rank is
  /// shape().rank(index)).
  const Result<R>& operator[](size_t index) const { return values_[index]; }
  const std::vector<Result<R>>& values() const { return values_; }
  /// True when every member answered.
  bool ok() const {
    for (auto& v : values_) {
      if (!v) return false;
    }
    return true;
  }
  /// The members that failed: (view index, why).
  std::vector<std::pair<size_t, Status>> errors() const {
    std::vector<std::pair<size_t, Status>> out;
    for (size_t i = 0; i < values_.size(); ++i) {
      if (!values_[i]) out.emplace_back(i, values_[i].error());
    }
    return out;
  }

 private:
  Shape shape_;
  std::vector<Result<R>> values_;
};

namespace detail {

/// Replies of a stream(), in arrival order: a bounded wait for each.
template <class R>
class ReplyQueue {
 public:
  explicit ReplyQueue(size_t expected) : left_(expected) {}
  void push(size_t index, Result<R>&& r) {
    std::lock_guard<std::mutex> lock(mu_);
    arrived_.emplace_back(index, std::move(r));
    cv_.notify_one();
  }
  /// The next reply, or nullopt once all came or the deadline passed (the
  /// caller then reports the missing ones).
  std::optional<std::pair<size_t, Result<R>>> pop(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (left_ == 0) return std::nullopt;
    if (!cv_.wait_until(lock, deadline, [this] { return !arrived_.empty(); })) return std::nullopt;
    auto next = std::move(arrived_.front());
    arrived_.pop_front();
    --left_;
    return next;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<size_t, Result<R>>> arrived_;
  size_t left_;
};

/// The reply slot of one member's ask in a stream().
template <class R>
class QueuedReply final : public ReplyTo<R> {
 public:
  QueuedReply(std::shared_ptr<ReplyQueue<R>> queue, size_t index) : queue_(std::move(queue)), index_(index) {}
  void complete(Result<R>&& r) override { queue_->push(index_, std::move(r)); }

 private:
  std::shared_ptr<ReplyQueue<R>> queue_;
  size_t index_;
};

/// The reply slot of a choose(): counts the member's asks in flight down,
/// then completes the caller's future.
template <class R>
class CountedReply final : public ReplyTo<R> {
 public:
  CountedReply(std::shared_ptr<std::vector<std::atomic<int64_t>>> in_flight, size_t rank, ReplyRef future)
      : in_flight_(std::move(in_flight)), rank_(rank), future_(std::move(future)) {}
  void complete(Result<R>&& r) override {
    (*in_flight_)[rank_].fetch_sub(1, std::memory_order_relaxed);
    static_cast<ReplyTo<R>*>(future_.get())->complete(std::move(r));
  }

 private:
  std::shared_ptr<std::vector<std::atomic<int64_t>>> in_flight_;
  size_t rank_;
  ReplyRef future_;
};

}  // namespace detail

/// The replies of ActorMesh::stream(), as they arrive.
template <class R>
class MeshStream {
 public:
  MeshStream(Shape shape, std::shared_ptr<detail::ReplyQueue<R>> queue, std::chrono::milliseconds timeout)
      : shape_(std::move(shape)),
        queue_(std::move(queue)),
        deadline_(std::chrono::steady_clock::now() + timeout),
        pending_(shape_.size(), true),
        left_(shape_.size()) {}

  const Shape& shape() const { return shape_; }
  /// The next reply: (view index, value or error), in the order they come;
  /// after the deadline, each member that has not answered as a timeout;
  /// nullopt when every member is accounted for.
  std::optional<std::pair<size_t, Result<R>>> next() {
    if (left_ == 0) return std::nullopt;
    if (auto r = queue_->pop(deadline_)) {
      pending_[r->first] = false;
      --left_;
      return r;
    }
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (!pending_[i]) continue;
      pending_[i] = false;
      --left_;
      return std::make_pair(i, Result<R>(error(ErrorCode::timeout, "mesh stream: member " + std::to_string(i) +
                                                                       " did not answer in time")));
    }
    return std::nullopt;
  }

 private:
  Shape shape_;
  std::shared_ptr<detail::ReplyQueue<R>> queue_;
  std::chrono::steady_clock::time_point deadline_;
  std::vector<bool> pending_;
  size_t left_;
};

/// What ActorMesh members share: their records and refs by global rank.
struct MeshMembers {
  Shape full;  // the whole mesh
  std::vector<ActorInfo> infos;
  std::vector<AnyRef> refs;  // refs that follow each member across restarts
  std::shared_ptr<ClusterClient::State> cluster;
  /// The processes' anchors (refs that follow them), and each member's
  /// process: a cast goes from anchor to anchor down a tree.
  std::vector<AnyRef> anchors;
  std::vector<size_t> process_of;
  /// Asks in flight per member from choose(), to pick the least loaded.
  std::shared_ptr<std::vector<std::atomic<int64_t>>> in_flight;
};

/// Delivered to a mesh's owner (ActorMesh::supervise) when a member fails:
/// which one, why, and whether it comes back (at the same coordinates).
struct MeshFailure {
  size_t rank = 0;
  std::vector<size_t> coords;
  std::string actor_id;
  std::string reason;
  /// True: it restarts and rejoins the mesh at its coordinates (messages
  /// to it wait); false: it is dead for good.
  bool restarting = false;
};

/// Some of a mesh's members as ranks of a collective group
/// (ActorMesh::group_ranks): for a group that spans several meshes.
struct GroupRanks {
  std::shared_ptr<ClusterClient::State> cluster;
  /// Each rank's process, by its anchor (a ref that follows it across
  /// restarts), in rank order.
  std::vector<AnyRef> anchors;
};

/// Makes one collective group of several meshes' members: the ranks are
/// `parts`' members, part after part, each in its view's order (a
/// trainer's rank 0 as rank 0 and the rollout engines after it, to
/// broadcast weights from the one to the others). Returns each rank's
/// handle, in rank order, to send to it. The group works as one made by
/// ActorMesh::make_group: a rank's process that dies breaks it on every
/// rank, whichever mesh. A process may hold ranks of several parts (an
/// actor of each mesh, colocated): they share its engine and, on CPU
/// memory, its host's arena; collectives on CUDA memory (NCCL) refuse such
/// a group. Errors: no ranks, parts of different clients, a process
/// between incarnations (make it once it is back).
Result<std::vector<CollectiveGroup>> make_group(const std::vector<GroupRanks>& parts,
                                                const GroupOptions& options = {});
/// Releases a group made by make_group(parts, ...) in every process of
/// `parts` (see ActorMesh::release_group).
Status release_group(const std::vector<GroupRanks>& parts, const CollectiveGroup& group);

namespace detail {
Status supervise_mesh(const MeshMembers& members, const AnyRef& owner);
/// The view's members as a group's ranks.
GroupRanks group_ranks(const MeshMembers& members, const Shape& view);
/// A cast to the members of `view`: down a tree of the processes' anchors.
Status mesh_cast(const MeshMembers& members, const Shape& view, MessageBox box);
}  // namespace detail

/// One actor of class A per process of a ProcMesh (or a view of them).
template <class A>
class ActorMesh {
 public:
  ActorMesh(Shape shape, std::shared_ptr<const MeshMembers> members)
      : shape_(std::move(shape)), members_(std::move(members)) {}

  const Shape& shape() const { return shape_; }
  size_t size() const { return shape_.size(); }
  /// The member at view index `index`.
  ActorRef<A> member(size_t index) const {
    return ActorRef<A>(detail::CellPtr(members_->refs[shape_.rank(index)].cell()));
  }
  /// Its record as the head had it when the mesh was made (id, node).
  const ActorInfo& info(size_t index) const { return members_->infos[shape_.rank(index)]; }

  /// Views: the same actors, fewer of them (see Shape).
  Result<ActorMesh> slice(const std::vector<std::pair<std::string, size_t>>& fixed) const {
    return view(shape_.slice(fixed));
  }
  Result<ActorMesh> range(const std::string& dim, size_t begin, size_t end, size_t step = 1) const {
    return view(shape_.range(dim, begin, end, step));
  }
  ActorMesh flatten(const std::string& name) const { return ActorMesh(shape_.flatten(name), members_); }
  Result<ActorMesh> rename(const std::string& from, const std::string& to) const {
    return view(shape_.rename(from, to));
  }

  /// Asks every member of the view and waits for all replies (each bounded
  /// by `timeout`): a member that fails or does not answer has its error in
  /// the result, the others their values.
  template <class M>
  ValueMesh<detail::reply_t<A, std::remove_cvref_t<M>>> call(
      const M& msg, std::chrono::milliseconds timeout = kDefaultTimeout) const {
    using R = detail::reply_t<A, std::remove_cvref_t<M>>;
    std::vector<Future<R>> pending;
    pending.reserve(size());
    for (size_t i = 0; i < size(); ++i) pending.push_back(member(i).ask(msg, timeout));
    std::vector<Result<R>> values;
    values.reserve(size());
    for (auto& f : pending) values.push_back(f.get());
    return ValueMesh<R>(shape_, std::move(values));
  }

  /// Asks every member and returns their replies as they arrive (each a
  /// view index and a value or error; members silent past `timeout` come
  /// last, as timeouts).
  template <class M>
  MeshStream<detail::reply_t<A, std::remove_cvref_t<M>>> stream(
      const M& msg, std::chrono::milliseconds timeout = std::chrono::seconds(30)) const {
    using V = std::remove_cvref_t<M>;
    using R = detail::reply_t<A, V>;
    auto queue = std::make_shared<detail::ReplyQueue<R>>(size());
    for (size_t i = 0; i < size(); ++i) {
      detail::ReplyRef reply(new detail::QueuedReply<R>(queue, i));
      (void)detail::send(members_->refs[shape_.rank(i)].cell(),
                         detail::Envelope(detail::MessageBox::make(V(msg)), &detail::invoke<A, V>, std::move(reply)));
    }
    return MeshStream<R>(shape_, std::move(queue), timeout);
  }

  /// Asks one member of the view: the one with the fewest of this mesh's
  /// choose() asks in flight (the first such in view order).
  template <class M>
  Future<detail::reply_t<A, std::remove_cvref_t<M>>> choose(
      const M& msg, std::chrono::milliseconds timeout = std::chrono::seconds(30)) const {
    using V = std::remove_cvref_t<M>;
    using R = detail::reply_t<A, V>;
    auto& load = *members_->in_flight;
    size_t best = shape_.rank(0);
    for (size_t i = 1; i < size(); ++i) {
      size_t r = shape_.rank(i);
      if (load[r].load(std::memory_order_relaxed) < load[best].load(std::memory_order_relaxed)) best = r;
    }
    load[best].fetch_add(1, std::memory_order_relaxed);
    detail::ReplyRef future(new detail::FutureState<R>());
    detail::ReplyRef reply(new detail::CountedReply<R>(members_->in_flight, best, future));
    (void)detail::send(members_->refs[best].cell(),
                       detail::Envelope(detail::MessageBox::make(V(msg)), &detail::invoke<A, V>, std::move(reply)));
    return Future<R>(std::move(future), timeout);
  }

  /// Makes a collective group of the view's members: rank i is the member
  /// at view index i. Returns each member's handle, in view order, to send
  /// to it (a CollectiveGroup is encodable: put it in one of your
  /// messages). `timeout` bounds each collective of the group. Fails when a
  /// member's process is between incarnations (try again once it is back).
  Result<std::vector<CollectiveGroup>> make_group(std::chrono::milliseconds timeout = std::chrono::seconds(30)) const {
    return troupe::make_group({group_ranks()}, GroupOptions{.timeout = timeout});
  }
  /// The same, with options (e.g. without the shared-memory data path).
  Result<std::vector<CollectiveGroup>> make_group(const GroupOptions& options) const {
    return troupe::make_group({group_ranks()}, options);
  }
  /// The view's members as ranks of a group across meshes
  /// (troupe::make_group(parts)), in view order.
  GroupRanks group_ranks() const { return detail::group_ranks(*members_, shape_); }
  /// Releases a group made by make_group on this view (`group`: any
  /// member's handle): in each of the view's processes its collectives in
  /// progress fail (not_found, "released"), and its shared memory, threads
  /// and NCCL communicator are freed; later collectives on it fail with
  /// not_found. A group lives until released or until its processes end:
  /// release the ones you no longer use (torch's destroy_process_group).
  /// Processes that cannot be reached are skipped (theirs went with them);
  /// the first other error is returned.
  Status release_group(const CollectiveGroup& group) const {
    return troupe::release_group({group_ranks()}, group);
  }

  /// Makes `owner` (an actor of this process that handles MeshFailure) the
  /// mesh's owner: each failure of a member is delivered to it (Monarch's
  /// mesh supervision). It handles it, or escalates by failing in its
  /// handler (its supervisor then decides). The mesh's actors stop when the
  /// driver that spawned them goes.
  Status supervise(const AnyRef& owner) const { return detail::supervise_mesh(*members_, owner); }

  /// Sends `msg` to every member of the view without waiting, once each,
  /// down a tree of the mesh's processes (each forwards to a few others:
  /// O(log n) hops, a few sends from the caller whatever the mesh's size).
  /// A member that is restarting gets it when it is back. Fails only when
  /// the message cannot be encoded (declare it with TROUPE_MESSAGE).
  template <class M>
  Status cast(const M& msg) const {
    static_assert(detail::accepts<A, std::remove_cvref_t<M>>, "cast: the actor class does not list this message type");
    return detail::mesh_cast(*members_, shape_, detail::MessageBox::make(std::remove_cvref_t<M>(msg)));
  }

 private:
  Result<ActorMesh> view(Result<Shape> shape) const {
    if (!shape) return error(shape.error());
    return ActorMesh(std::move(*shape), members_);
  }

  Shape shape_;
  std::shared_ptr<const MeshMembers> members_;
};

/// How a ProcMesh's processes are kept.
struct ProcMeshOptions {
  /// Restarts of a process (with its actors) after it dies: -1 without
  /// limit (the default), 0 none.
  int max_restarts = -1;
  /// How long to wait for the placement group and the processes.
  std::chrono::milliseconds timeout{60'000};
};

/// Processes laid out by a shape, one per bundle of a placement group.
class ProcMesh {
 public:
  /// Starts one worker process per bundle of `placement_group` (waiting for
  /// the group to be created), member rank i in bundle i. The shape's size
  /// must equal the number of bundles.
  static Result<ProcMesh> create(const ClusterClient& cluster, Shape shape, const std::string& placement_group,
                                 ProcMeshOptions options = {});

  /// Starts one worker process on each node of `nodes` (node ids, in rank
  /// order, repeated for several processes on a node); `nodes.size()` must
  /// equal the shape's size. No resources are reserved for them.
  static Result<ProcMesh> create_on_nodes(const ClusterClient& cluster, Shape shape,
                                          const std::vector<std::string>& nodes, ProcMeshOptions options = {});

  const Shape& shape() const { return shape_; }
  /// The anchor actors' records (node, worker), by global rank.
  const std::vector<ActorInfo>& processes() const { return procs_; }

  /// One actor of class A per process, built from `args`, with `options`
  /// (its restarts, snapshots, mailbox; placement is the mesh's). Waits
  /// until all are alive.
  template <class A, class... Args>
  Result<ActorMesh<A>> spawn(ActorOptions options, Args&&... args) const {
    return spawn_per_process<A>(1, "", std::move(options), std::forward<Args>(args)...);
  }

  /// `count` actors of class A in every process: the mesh's shape gets an
  /// innermost dimension `dim` of that size (64 actors as 8 per process on
  /// 8 processes: {hosts, procs, dim=8}).
  template <class A, class... Args>
  Result<ActorMesh<A>> spawn_per_process(size_t count, const std::string& dim, ActorOptions options,
                                         Args&&... args) const {
    Shape shape = shape_;
    if (count != 1 || !dim.empty()) {
      std::vector<std::pair<std::string, size_t>> dims;
      for (size_t d = 0; d < shape_.names().size(); ++d) dims.emplace_back(shape_.names()[d], shape_.sizes()[d]);
      dims.emplace_back(dim, count);
      auto extended = Shape::make(std::move(dims));
      if (!extended) return error(extended.error());
      shape = std::move(*extended);
    }
    std::vector<Future<ActorInfo>> pending;
    auto members = std::make_shared<MeshMembers>();
    for (size_t process = 0; process < procs_.size(); ++process) {
      for (size_t k = 0; k < count; ++k) {
        ActorOptions o = options;
        o.colocate_with = procs_[process].id;
        o.placement_group.clear();
        o.bundle = -1;
        o.name.clear();
        pending.push_back(cluster_.spawn_async<A>(o, args...));
        members->process_of.push_back(process);
      }
    }
    members->full = shape;
    members->cluster = cluster_.state();
    members->anchors = anchors_;
    members->in_flight = std::make_shared<std::vector<std::atomic<int64_t>>>(shape.size());
    for (auto& f : pending) {
      auto info = f.get();
      if (!info) return error(info.error().code(), "mesh: a member did not start: " + info.error().message());
      auto ref = cluster_.follow<A>(*info);
      if (!ref) return error(ref.error());
      members->infos.push_back(*info);
      members->refs.push_back(AnyRef(detail::CellPtr(ref->cell())));
    }
    return ActorMesh<A>(std::move(shape), std::move(members));
  }

  /// Stops the processes (and every actor in them).
  Status stop() const;

 private:
  ProcMesh(ClusterClient cluster, Shape shape, std::vector<ActorInfo> procs, std::vector<AnyRef> anchors)
      : cluster_(std::move(cluster)), shape_(std::move(shape)), procs_(std::move(procs)), anchors_(std::move(anchors)) {}

  ClusterClient cluster_;
  Shape shape_;
  std::vector<ActorInfo> procs_;
  std::vector<AnyRef> anchors_;
};

}  // namespace troupe
