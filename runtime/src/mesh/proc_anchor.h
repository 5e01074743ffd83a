// The actor that holds each process of a ProcMesh: the head keeps it (and
// restarts it), the mesh's actors are colocated with it, casts pass through
// it down a tree, and it is the process's collective engine
// (collective_engine.cc).
#pragma once

#include <unistd.h>

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "troupe/bytes.h"
#include "cluster/protocol.h"
#include "collectives/arena_runner.h"
#include "collectives/hierarchy.h"
#include "collectives/host_arena.h"
#include "collectives/host_id.h"
#include "collectives/nccl_comm.h"
#include "collectives/ring.h"
#include "collectives/shm_slots.h"
#include "troupe/actor.h"
#include "troupe/collective_group.h"
#include "troupe/detail/relay.h"
#include "troupe/message.h"

namespace troupe::mesh {

struct AnchorPid {
  TROUPE_MESSAGE_NAMED(AnchorPid, "troupe.mesh.AnchorPid");
};
/// Driver -> engine: which host the process is on, as shared memory sees
/// it (collectives/host_id.h): how the driver lays a group out over hosts.
struct AnchorHost {
  TROUPE_MESSAGE_NAMED(AnchorHost, "troupe.mesh.AnchorHost");
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

/// Driver -> engine: rank `group.rank` of this process joins the group.
/// `hosts`: the host of every rank (collectives/hierarchy.h's GroupLayout),
/// each host's ranks sharing the arena the driver had made (MakeArena) and
/// mapped in its processes (OpenArena); empty: no arenas, every CPU
/// collective a ring or tree over all ranks.
struct JoinGroup {
  CollectiveGroup group;
  std::vector<uint32_t> hosts;
  TROUPE_MESSAGE_NAMED(JoinGroup, "troupe.mesh.JoinGroup", group, hosts);
};
/// Driver -> every engine of a group: the group is released
/// (ActorMesh::release_group): fail its collectives in progress, free its
/// shared memory, threads and NCCL communicator, and forget it.
struct LeaveGroup {
  std::string group;
  TROUPE_MESSAGE_NAMED(LeaveGroup, "troupe.mesh.LeaveGroup", group);
};
/// Driver -> the engine of the first process of a group's host, before
/// JoinGroup: make a host arena for the group's `ranks` ranks on this host
/// (collectives/host_arena.h), answered with what the others need to map it.
struct MakeArena {
  std::string group;
  uint32_t ranks = 0;
  uint64_t chunk_bytes = 0;
  TROUPE_MESSAGE_NAMED(MakeArena, "troupe.mesh.MakeArena", group, ranks, chunk_bytes);
};
/// Driver -> the engines of the other processes of that host: map that
/// arena (an error when this process cannot: another host, another namespace).
struct OpenArena {
  std::string group;
  uint32_t ranks = 0;
  collectives::SlotsOffer offer;
  TROUPE_MESSAGE_NAMED(OpenArena, "troupe.mesh.OpenArena", group, ranks, offer);
};
/// A rank's arena runner -> its engine: the arena stage of collective `seq`
/// of rank `rank` ended (code 0: done; otherwise why not); `path`: how its
/// data moved (collectives::ArenaPath).
struct ArenaDone {
  std::string group;
  uint32_t rank = 0;
  uint64_t seq = 0;
  uint8_t code = 0;
  std::string why;
  uint8_t path = 0;
  TROUPE_MESSAGE_NAMED(ArenaDone, "troupe.mesh.ArenaDone", group, rank, seq, code, why, path);
};
/// Engine -> engine: a ring step's data for rank `to_rank`.
struct RingChunk {
  std::string group;
  uint32_t to_rank = 0;
  uint32_t from_rank = 0;
  uint64_t seq = 0;
  uint64_t step = 0;  // ring kinds: the step; broadcast: the chunk; barrier: unused
  bool tree = false;  // from a broadcast or barrier: matched by sender, not step
  /// What the sender was asked for (kind, count, type, op, root): ranks
  /// that disagree fail the collective with a clear error, not garbage.
  uint64_t signature = 0;
  /// The data: in the message (Bytes: sent from where it lies, received
  /// as a slice of the frame), or (slot > 0) `slot_bytes` bytes in slot
  /// `slot - 1` of the receiver's shared-memory segment (collectives/shm_slots.h).
  troupe::Bytes bytes;
  uint32_t slot = 0;
  uint64_t slot_bytes = 0;
  TROUPE_MESSAGE_NAMED(RingChunk, "troupe.mesh.RingChunk", group, to_rank, from_rank, seq, step, tree, signature,
                       bytes, slot, slot_bytes);
};

/// Engine of rank `from_rank` -> engine of the rank before it (`to_rank`,
/// which sends to it): map these slots and write your chunks there.
struct SlotsOffered {
  std::string group;
  uint32_t to_rank = 0;
  uint32_t from_rank = 0;
  collectives::SlotsOffer offer;
  TROUPE_MESSAGE_NAMED(SlotsOffered, "troupe.mesh.SlotsOffered", group, to_rank, from_rank, offer);
};
/// Engine of rank 0 -> the group's other engines: the unique id of the
/// group's NCCL communicator (made on rank 0's first collective on CUDA
/// memory).
struct NcclId {
  std::string group;
  std::string id;
  TROUPE_MESSAGE_NAMED(NcclId, "troupe.mesh.NcclId", group, id);
};

/// Anyone -> engine: how the chunks this process received for `group` came
/// (answered with GroupCounters): how the data path is checked in tests.
struct GroupStats {
  std::string group;
  TROUPE_MESSAGE_NAMED(GroupStats, "troupe.mesh.GroupStats", group);
};
struct GroupCounters {
  uint64_t chunks_in_slots = 0;     // read from shared memory
  uint64_t chunks_in_messages = 0;  // carried in the message (non-empty)
  uint64_t reduced_into_slots = 0;  // reduces written straight on to the next rank (reduce_and_send)
  uint64_t arena_collectives = 0;   // collectives done (at least in part) through a host arena
  uint64_t hierarchical_collectives = 0;  // of those, ones whose data also went between hosts
  uint64_t bytes_in_messages = 0;   // data received in messages (between hosts, or without shared memory)
  uint64_t pipelined_pieces = 0;    // pieces of pipelined collectives done
  uint64_t arena_in_place = 0;      // arena stages that read some rank's CollectiveBuffer in place
  uint64_t arena_written_in_place = 0;  // of those, allreduces written into every rank's buffer
  uint64_t most_tree_chunks_waiting = 0;  // most broadcast chunks (and barrier tokens) a rank held before its turn
  TROUPE_FIELDS(chunks_in_slots, chunks_in_messages, reduced_into_slots, arena_collectives,
                hierarchical_collectives, bytes_in_messages, pipelined_pieces, arena_in_place,
                arena_written_in_place, most_tree_chunks_waiting);
};

/// Receiver -> sender (rank `to_rank`): slot `slot` is free again.
struct SlotFree {
  std::string group;
  uint32_t to_rank = 0;
  uint32_t slot = 0;
  TROUPE_MESSAGE_NAMED(SlotFree, "troupe.mesh.SlotFree", group, to_rank, slot);
};

/// Receiver of a broadcast's chunks -> the rank it gets them from
/// (`to_rank`): rank `from_rank` has applied the first `chunks` chunks of
/// collective `seq`, so that many more may be sent (the sender keeps at
/// most a few unacknowledged on each edge: see kTreeWindow).
struct TreeAck {
  std::string group;
  uint32_t to_rank = 0;
  uint32_t from_rank = 0;
  uint64_t seq = 0;
  uint64_t chunks = 0;
  TROUPE_MESSAGE_NAMED(TreeAck, "troupe.mesh.TreeAck", group, to_rank, from_rank, seq, chunks);
};

/// Engine -> the group's other engines: the group is broken (a rank saw
/// disagreeing calls, ran out of time, lost a peer), so they fail at once too.
struct GroupBroken {
  std::string group;
  std::string why;
  uint8_t code = 0;  // the ErrorCode it broke with
  TROUPE_MESSAGE_NAMED(GroupBroken, "troupe.mesh.GroupBroken", group, why, code);
};

class ProcAnchor final
    : public Actor<ProcAnchor, AnchorPid, AnchorHost, MeshCast, JoinGroup, Collective, RingChunk, GroupBroken, SlotsOffered,
                   SlotFree, TreeAck, GroupStats, NcclId, MakeArena, OpenArena, ArenaDone, LeaveGroup> {
 public:
  /// `rank`: its place in the mesh, shown in the actor table.
  explicit ProcAnchor(uint64_t rank) { (void)rank; }
  int64_t handle(const AnchorPid&) { return getpid(); }
  std::string handle(const AnchorHost&) { return collectives::host_id(); }
  void handle(const MeshCast& m);

  // Collectives (collective_engine.cc).
  Result<void> handle(const JoinGroup& m);
  Deferred<void> handle(const Collective& m);
  void handle(const RingChunk& m);
  void handle(const GroupBroken& m);
  void handle(const SlotsOffered& m);
  void handle(const SlotFree& m);
  void handle(const TreeAck& m);
  Result<GroupCounters> handle(const GroupStats& m);
  Result<collectives::SlotsOffer> handle(const MakeArena& m);
  Result<void> handle(const OpenArena& m);
  void handle(const ArenaDone& m);
  Result<void> handle(const LeaveGroup& m);
  // Collectives on CUDA memory, through NCCL (nccl_engine.cc).
  void handle(const NcclId& m);

 private:
  /// A step of a barrier's net stage.
  struct PeerStep {
    uint32_t peer = 0;
    bool send = false;
  };
  /// A broadcast's net stage: the buffer in chunks, each received from the
  /// parent in order and sent on to every child as soon as it is here
  /// (collectives/ring.h's broadcast_tree), within its edges' windows
  /// (LocalRank::tree_edges).
  struct TreeBroadcast {
    std::optional<uint32_t> parent;   // group rank; none for the net root
    std::vector<uint32_t> children;   // group ranks
    std::vector<collectives::ElemRange> chunks;  // in the whole buffer
    size_t received = 0;              // chunks from the parent applied
    std::vector<size_t> sent;         // by child: chunks sent
  };
  /// A rank's edge to a child of its broadcasts, across collectives: at
  /// most kTreeWindow chunks on it that the child has not acknowledged
  /// (TreeAck), whichever collectives they are of. So a child that has not
  /// called yet holds a few chunks in all, not a few of each broadcast the
  /// senders finished without it: past the window, their next broadcast
  /// waits for it (as NCCL's sends wait for the receiver's buffer). A
  /// collective's chunks go on the edge only after every earlier one's
  /// (`sending`): the child applies them in that order, so the window
  /// always drains once the child calls, and no later broadcast takes the
  /// credits an earlier one needs.
  struct TreeEdge {
    std::set<uint64_t> sending;  // collectives with chunks still to send on it
    struct Sent {
      size_t sent = 0;
      size_t acked = 0;
    };
    std::map<uint64_t, Sent> unacked;  // by collective: chunks on the edge, until all are acknowledged
    size_t in_flight = 0;              // sum of sent - acked over `unacked`
  };
  /// One collective in progress for one local rank.
  struct Op {
    uint64_t seq = 0;  // its key in LocalRank::ops
    CollectiveKind kind = CollectiveKind::allreduce;
    /// CPU: its stages (in this host's arena, between engines) and where
    /// it is in them.
    collectives::CollectivePlan plan;
    size_t stage = 0;
    /// Its current (arena) stage is with the rank's arena runner.
    bool on_arena = false;
    /// A piece of a pipelined collective (see handle(Collective)): how many
    /// of its pieces are not done yet, shared by them; the caller's reply
    /// goes once all are. Null for a collective in one piece.
    std::shared_ptr<size_t> pieces_left;
    /// The net stage's steps: a ring's (schedule), a broadcast's (tree) or a
    /// barrier's (peer_steps), in group ranks and offsets into the whole buffer.
    collectives::RingSchedule schedule;
    TreeBroadcast tree;
    std::vector<PeerStep> peer_steps;
    size_t next_peer_step = 0;
    std::byte* data = nullptr;
    size_t count = 0;
    DType dtype = DType::float32;
    ReduceOp op = ReduceOp::sum;
    uint32_t root = 0;       // broadcast
    bool gpu = false;        // on CUDA memory: run by the group's NCCL communicator
    bool enqueued = false;   // gpu: on the communicator's stream
    uint64_t signature = 0;  // see RingChunk
    std::string what;        // "allreduce of 1000 float32 (sum)", for errors
    size_t next_send = 0;  // steps sent so far
    size_t next_recv = 0;  // steps received and applied so far
    Deferred<void> reply;
  };
  struct LocalRank {
    uint64_t next_seq = 0;               // the next collective this rank calls
    std::map<uint64_t, Op> ops;          // by sequence number
    /// The order in which this rank hands its collectives' arena stages to
    /// the arena: (sequence number, stage index), the same on every rank of
    /// the host (set when the collectives are called), so the arena never
    /// sees different collectives on two ranks, whichever net stage ends
    /// first. A stage waits until it is at the front.
    std::deque<std::pair<uint64_t, size_t>> arena_order;
    struct Early {
      uint64_t signature = 0;
      uint32_t from = 0;
      troupe::Bytes bytes;  // shares the message's
      uint32_t slot = 0;    // as in RingChunk
      uint64_t slot_bytes = 0;
    };
    std::map<std::pair<uint64_t, uint64_t>, Early> early;  // ring: (seq, step) -> data before its turn
    /// Broadcast and barrier: (seq, from rank, chunk) -> data that came
    /// before the schedule got to it (a barrier's chunk is 0).
    std::map<std::tuple<uint64_t, uint32_t, uint64_t>, Early> early_from;
    std::map<uint32_t, TreeEdge> tree_edges;  // by child rank
  };
  struct Group {
    CollectiveGroup spec;
    /// Which ranks share a host and its arena (flat: none do).
    collectives::GroupLayout layout;
    std::vector<AnyRef> engines;  // by rank
    std::map<uint32_t, LocalRank> ranks;  // the ranks in this process
    Status broken;                // set once a collective cannot complete
    std::vector<MonitorId> monitors;
    /// Shared-memory slots each local rank receives in (from the rank
    /// before it), and those of the next rank that it writes to, with the
    /// slots it may write (credits: the receiver gives each back once read).
    std::map<uint32_t, collectives::SlotSegment> inboxes;
    struct Outbox {
      uint32_t owner = 0;  // the rank whose slots they are: chunks for it only
      collectives::SlotSegment segment;
      std::vector<uint32_t> free;
    };
    std::map<uint32_t, Outbox> outboxes;
    GroupCounters counters;
    /// The arena of this process's host, when the group has other ranks
    /// there, and a runner per local rank (made on its first arena stage).
    struct Arena {
      std::unique_ptr<collectives::HostArena> arena;
      std::map<uint32_t, std::unique_ptr<collectives::ArenaRunner>> runners;
      Arena() = default;
      Arena(Arena&&) = default;
      Arena& operator=(Arena&&) = default;
      /// Breaks the arena for every rank (in every process) and stops the
      /// runners, so no runner touches a caller's buffer any more.
      void close();
      ~Arena() { close(); }
    };
    Arena arena;
    /// The group's NCCL communicator (its single local rank's), made on
    /// the first collective on CUDA memory.
    struct Gpu {
      std::string unique_id;  // made by rank 0, sent to the others
      std::unique_ptr<collectives::NcclComm> comm;
      bool initialized = false;
      bool poll_set = false;  // a poll timer is pending
    };
    Gpu gpu;
  };

  /// Group `group` (unbroken), its local rank `rank`, and that rank's
  /// collective `seq`: each null from the first that is not here (a
  /// message for a released or broken group, a finished collective).
  struct Found {
    Group* group = nullptr;
    LocalRank* rank = nullptr;
    Op* op = nullptr;
  };
  Found find_live(const std::string& group, uint32_t rank, uint64_t seq);
  /// Starts the collective's current stage (in the arena, or between the
  /// engines), or answers it when there are none left.
  void advance(Group& g, uint32_t rank, uint64_t seq);
  /// In a ring net stage: sends what the pipeline allows, applies chunks
  /// that came early, and goes on to the next stage when done.
  void pump(Group& g, uint32_t rank, uint64_t seq);
  /// The same for a barrier's net stage: sends and receives in schedule order.
  void pump_peers(Group& g, uint32_t rank, uint64_t seq);
  /// The same for a broadcast's net stage: applies the parent's chunks that
  /// are here (in order, acknowledging them), sends the children what their
  /// windows allow, and goes on to the next stage when every chunk is here
  /// and sent on.
  void pump_tree(Group& g, uint32_t rank, uint64_t seq);
  /// Fills op's schedule (ring kinds), tree (broadcast) or peer_steps
  /// (barrier) for its plan's net stage, in group ranks and offsets into the
  /// whole buffer.
  static void set_net_steps(Op& op, const collectives::Stage& stage, size_t chunk_elems);
  /// True while op is in its net stage (its chunks are applied only then).
  static bool in_net_stage(const Op& op);
  /// The net stage is done: takes the average its plan asks for, and goes on.
  void net_done(Group& g, uint32_t rank, uint64_t seq);
  /// Answers the collective (after its last stage) and forgets it.
  void finish(Group& g, uint32_t rank, uint64_t seq);
  /// Applies step `step`'s data (reduces or copies it in), from the message
  /// or from a slot (which then goes back to its sender). False when the
  /// slot is not one of this rank's (the group is then broken).
  bool apply(Group& g, uint32_t rank, Op& op, size_t step, uint32_t from, const troupe::Bytes& bytes, uint32_t slot,
             uint64_t slot_bytes);
  /// Rank `to`'s slots, when a chunk of `bytes` from `rank` goes through
  /// them (nullptr: it goes in the message: empty, no slots offered by `to`,
  /// too big).
  Group::Outbox* outbox_for(Group& g, uint32_t rank, uint32_t to, size_t bytes);
  /// A slot taken for a chunk: `number` as RingChunk says it (index + 1),
  /// `at` where to write; at == nullptr when none is free yet.
  struct TakenSlot {
    uint32_t number = 0;
    std::byte* at = nullptr;
  };
  TakenSlot take_slot(Group::Outbox& out);
  /// Sends op's next step: its data already in slot `slot_number`
  /// (`slot_bytes` of it), or (slot_number 0) in `bytes`.
  void send_step(Group& g, uint32_t rank, Op& op, uint32_t slot_number, uint64_t slot_bytes, troupe::Bytes bytes = {});
  /// A reduce-scatter step's reduce written straight into a slot of the
  /// next rank as the send of step + C, when that send is next and its data
  /// is not needed here again: two reads and a write where reduce-then-copy
  /// takes three and two. False (nothing done) otherwise.
  bool reduce_and_send(Group& g, uint32_t rank, Op& op, size_t step, const std::byte* in, size_t n);
  /// Makes rank `rank`'s slots and offers them to the rank before it.
  void offer_slots(Group& g, uint32_t rank);
  /// False (and the group broken with a clear error) when rank `from` sent
  /// data for another collective than `op`.
  bool agrees(Group& g, const Op& op, uint64_t signature, uint32_t from);
  /// agrees() for everything that came for `op` before it was called.
  bool parked_agree(Group& g, LocalRank& lr, const Op& op);
  /// False (and the group broken as malformed) when chunk `chunk` of
  /// broadcast `op` came from another rank than its parent, or past its
  /// last chunk; true for other kinds.
  bool expected_tree_chunk(Group& g, const Op& op, uint32_t from, uint64_t chunk);
  /// Runs the group's collectives on CUDA memory: makes (or waits for) the
  /// communicator, enqueues the ops in order once it is up, and answers
  /// them when the GPU is done, polling every millisecond meanwhile.
  void gpu_progress(const std::string& group);
  /// Hands the current (arena) stage of `op` of rank `rank` to its arena runner.
  void run_on_arena(Group& g, uint32_t rank, Op& op);
  /// How many pieces collective (kind, count, dtype) runs in on group g: 1,
  /// or up to the group's pipeline_pieces for an allreduce over several
  /// hosts with arenas, so its stages overlap.
  static size_t pipeline_pieces(const Group& g, CollectiveKind kind, size_t count, DType dtype);
  /// Hands over the arena stage now at the front of the rank's arena_order
  /// if its collective is waiting at it.
  void resume_arena_waiters(Group& g, uint32_t rank);
  /// Keeps an arena made or mapped for group `id` until its JoinGroup (a
  /// few at most: a driver that died before it leaves one behind).
  void keep_pending_arena(const std::string& id, collectives::HostArena arena);
  /// Fails every collective in progress in the group, for good; with
  /// `tell_others`, the other engines of the group do the same.
  /// `released`: by its driver (LeaveGroup), which is not worth a warning.
  void break_group(const std::string& id, Status why, bool tell_others = false, bool released = false);

  std::map<std::string, Group> groups_;
  /// Arenas made or mapped (MakeArena, OpenArena) whose JoinGroup has not
  /// come yet, oldest first.
  std::deque<std::pair<std::string, std::unique_ptr<collectives::HostArena>>> pending_arenas_;
};

}  // namespace troupe::mesh
