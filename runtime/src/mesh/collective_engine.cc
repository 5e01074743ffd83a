// The collective engine of a mesh process (ProcAnchor's collective
// handlers). A collective on CPU memory runs a plan (collectives/hierarchy.h):
// stages in the arena of this rank's host (collectives/host_arena.h), run on
// a thread per local rank (collectives/arena_runner.h) that answers through
// ArenaDone, and at most one stage between the engines: a ring (schedule
// from collectives/ring.h, arithmetic from collectives/reduce.h) or a tree.
// A group on one host is one arena stage; a group with no arenas is one
// ring or tree over all ranks. On the ring each chunk goes to the next
// rank's engine as a message, with its bytes, or, when both are on one
// host, written into a shared-memory slot of the next rank
// (collectives/shm_slots.h) with a small message saying which; the receiver
// reads it from there and gives the slot back. C chunk steps are in flight
// at once (the schedule says when a send may read what was received),
// bounded by the free slots. A broadcast between the engines goes in chunks
// of the same size down a binomial tree or a chain (collectives/ring.h's
// broadcast_tree), each chunk forwarded as soon as it is here, with at most
// kTreeWindow chunks on an edge that the receiver has not acknowledged
// (TreeAck), counted across collectives: no single message of the whole
// buffer, and a receiver that calls late holds a few chunks in all, not
// the buffer, nor a few of each of the broadcasts its senders went on to
// (they wait for it past the window). A dead peer engine, or the group's
// deadline, fails every collective in progress on the surviving ranks, and
// breaks the group (and its arenas).
#include <algorithm>
#include <cstring>
#include <thread>

#include "collectives/reduce.h"
#include "troupe/codec.h"
#include "log.h"
#include "mesh/proc_anchor.h"

namespace troupe {

AnyRef CollectiveGroup::engine(const AnyRef& self) const {
  if (!self || rank >= engines.size()) return {};
  auto cell = detail::cell_at(self.cell(), engines[rank].address, engines[rank].id);
  return cell ? AnyRef(std::move(*cell)) : AnyRef();
}

namespace mesh {

namespace {
/// The ErrorCode of a failure that came as a byte (GroupBroken, ArenaDone):
/// one that is not a failure's code (ok, or from a newer build) reads as
/// invalid_argument, so a group never breaks with "ok".
ErrorCode failure_code(uint8_t code) {
  if (code == 0 || code > static_cast<uint8_t>(ErrorCode::storage)) return ErrorCode::invalid_argument;
  return static_cast<ErrorCode>(code);
}

/// Bounds on a group's chunk size (GroupOptions::chunk_bytes): a page at
/// least (slots are pages), and small enough that a heartbeat is never held
/// up long behind a chunk.
constexpr uint64_t kMinChunkBytes = 4096;
constexpr uint64_t kMaxChunkBytes = uint64_t{64} << 20;
/// Slots of a chunk each rank offers the rank before it: chunks it may
/// have written and not yet seen read. With credits no ring deadlocks (the
/// rank that has sent least can always go on), so this only bounds memory.
constexpr uint32_t kSlots = 8;
/// Chunks of a broadcast a rank may have sent down one edge and not yet
/// heard applied (TreeAck): enough to keep the link busy over an ack's
/// round trip, few enough that a slow or late receiver holds at most this
/// many chunks of memory for it, and that a heartbeat queued behind them
/// waits for a few chunks, not for the whole buffer.
constexpr size_t kTreeWindow = 4;
}  // namespace

Result<void> ProcAnchor::handle(const JoinGroup& m) {
  const CollectiveGroup& spec = m.group;
  if (spec.chunk_bytes < kMinChunkBytes || spec.chunk_bytes > kMaxChunkBytes) {
    return error(ErrorCode::invalid_argument, "collectives: group " + spec.id + ": chunk_bytes " +
                                                  std::to_string(spec.chunk_bytes) + " is outside [4 KiB, 64 MiB]");
  }
  if (spec.pipeline_pieces < 1 || spec.pipeline_pieces > kMaxPipelinePieces) {
    return error(ErrorCode::invalid_argument, "collectives: group " + spec.id + ": pipeline_pieces " +
                                                  std::to_string(spec.pipeline_pieces) + " is outside [1, " +
                                                  std::to_string(kMaxPipelinePieces) + "]");
  }
  if (spec.size == 0 || spec.rank >= spec.size || spec.engines.size() != spec.size ||
      (!m.hosts.empty() && m.hosts.size() != spec.size)) {
    return error(ErrorCode::invalid_argument, "collectives: group " + spec.id + " is malformed (rank " +
                                                  std::to_string(spec.rank) + " of " + std::to_string(spec.size) +
                                                  ", " + std::to_string(spec.engines.size()) + " engines, hosts for " +
                                                  std::to_string(m.hosts.size()) + ")");
  }
  Group& g = groups_[spec.id];
  if (g.engines.empty()) {
    g.spec = spec;
    g.layout = m.hosts.empty() ? collectives::GroupLayout::flat(spec.size)
                               : collectives::GroupLayout::make(m.hosts).value();
    detail::CellControl* me = self().cell();
    for (uint32_t r = 0; r < spec.size; ++r) {
      auto cell = detail::cell_at(me, spec.engines[r].address, spec.engines[r].id);
      if (!cell) {
        groups_.erase(spec.id);
        return error(cell.error().code(), "collectives: rank " + std::to_string(r) + "'s engine: " +
                                              cell.error().message());
      }
      g.engines.emplace_back(std::move(*cell));
    }
    // A peer process that goes makes every collective of the group fail at
    // once rather than wait for data that will never come.
    std::set<uint64_t> watched;
    for (uint32_t r = 0; r < spec.size; ++r) {
      if (g.engines[r] == self() || !watched.insert(g.engines[r].id()).second) continue;
      std::string id = spec.id;
      std::string where = spec.engines[r].address;
      g.monitors.push_back(monitor(g.engines[r], [this, id, r, where](const Down& d) {
        // The others are told too: a connection lost between two processes
        // only is seen by those two, and the rest would wait for the deadline.
        break_group(id,
                    Status(ErrorCode::peer_lost, "collectives: rank " + std::to_string(r) + "'s process (" + where +
                                                     ") is gone: " + d.reason.to_string()),
                    /*tell_others=*/true);
      }));
    }
  }
  g.ranks[spec.rank];  // this process hosts that rank
  bool shares_host = g.layout.ranks_on(g.layout.host_of(spec.rank)).size() > 1;
  if (shares_host) {
    if (!g.arena.arena) {
      auto p = std::find_if(pending_arenas_.begin(), pending_arenas_.end(),
                            [&](const auto& e) { return e.first == spec.id; });
      if (p == pending_arenas_.end()) {
        return error(ErrorCode::not_found, "collectives: group " + spec.id +
                                               "'s arena is not mapped in this process (made too long ago?); "
                                               "make the group again");
      }
      g.arena.arena = std::move(p->second);
      pending_arenas_.erase(p);
    }
  } else {
    std::erase_if(pending_arenas_, [&](const auto& e) { return e.first == spec.id; });
  }
  // Ring slots for the flat ring (allgather, or every kind without arenas):
  // a group on one host never uses it.
  if (spec.shared_memory && spec.size > 1 && g.layout.hosts() > 1) offer_slots(g, spec.rank);
  return {};
}

void ProcAnchor::keep_pending_arena(const std::string& id, collectives::HostArena arena) {
  constexpr size_t kMaxPending = 16;
  while (pending_arenas_.size() >= kMaxPending) pending_arenas_.pop_front();
  pending_arenas_.emplace_back(id, std::make_unique<collectives::HostArena>(std::move(arena)));
}

Result<collectives::SlotsOffer> ProcAnchor::handle(const MakeArena& m) {
  auto arena = collectives::HostArena::create(m.ranks, m.chunk_bytes);
  if (!arena) return error(arena.error());
  collectives::SlotsOffer offer = arena->offer();
  keep_pending_arena(m.group, std::move(*arena));
  return offer;
}

Result<void> ProcAnchor::handle(const OpenArena& m) {
  for (const auto& [id, arena] : pending_arenas_) {
    if (id == m.group) return {};  // this process made it (it hosts rank 0 too)
  }
  auto arena = collectives::HostArena::open(m.offer, m.ranks);
  if (!arena) return error(arena.error());
  keep_pending_arena(m.group, std::move(*arena));
  return {};
}

void ProcAnchor::Group::Arena::close() {
  if (arena) arena->abort();
  runners.clear();  // each joins its thread, which the abort let go
  arena.reset();
}

void ProcAnchor::resume_arena_waiters(Group& g, uint32_t rank) {
  auto lr = g.ranks.find(rank);
  if (lr == g.ranks.end() || !g.broken.ok()) return;
  auto& order = lr->second.arena_order;
  while (!order.empty()) {
    auto [seq, stage] = order.front();
    auto op = lr->second.ops.find(seq);
    if (op == lr->second.ops.end()) {  // gone without its stage (a bug): do not hold up the rest
      order.pop_front();
      continue;
    }
    // Its turn: handed over now if it is there (advance -> run_on_arena pops
    // it and comes back here for the next), else when it gets there.
    if (op->second.stage == stage && !op->second.on_arena) advance(g, rank, seq);
    return;
  }
}

void ProcAnchor::run_on_arena(Group& g, uint32_t rank, Op& op) {
  if (!g.arena.arena) {  // a JoinGroup without its arena was refused: a bug if it comes to this
    break_group(g.spec.id, Status(ErrorCode::invalid_argument, "collectives: group " + g.spec.id + ": rank " +
                                                                   std::to_string(rank) + " has no arena here"));
    return;
  }
  const collectives::Stage& stage = op.plan.stages[op.stage];
  auto& runner = g.arena.runners[rank];
  if (!runner) {
    AnyRef engine = self();
    std::string id = g.spec.id;
    runner = std::make_unique<collectives::ArenaRunner>(
        *g.arena.arena, g.layout.local_index(rank), [engine, id, rank](uint64_t seq, Status status, collectives::ArenaPath path) {
          // A full mailbox would lose the answer (the collective would then
          // fail at its deadline): the runner's thread can afford to wait
          // for room, paced, for a while.
          for (int attempt = 0;; ++attempt) {
            Status sent =
                engine.tell(ArenaDone{id, rank, seq, static_cast<uint8_t>(status.code()), status.message(),
                                  static_cast<uint8_t>(path)});
            if (sent.code() != ErrorCode::mailbox_full || attempt == 1000) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        });
  }
  // A little past the group's deadline: the engine's own timer breaks the
  // group first, with its message; this only bounds a runner left alone.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(g.spec.timeout_ms) + std::chrono::seconds(1);
  // The host's ranks agree on the stage (the k-th arena stage of the same
  // collective), whatever else their plans hold (a leader's net stage).
  uint64_t arena_stages = static_cast<uint64_t>(std::count_if(
      op.plan.stages.begin(), op.plan.stages.begin() + static_cast<std::ptrdiff_t>(op.stage),
      [](const collectives::Stage& s) { return s.where == collectives::StageWhere::arena; }));
  uint64_t signature = op.signature ^ (0x9e3779b97f4a7c15ULL * (arena_stages + 1));
  std::string what = op.plan.stages.size() == 1 ? op.what
                                                 : op.what + " (its " + std::string(kind_name(stage.kind)) + " in the host's arena)";
  op.on_arena = true;
  g.ranks[rank].arena_order.pop_front();  // this stage, at the front (advance checked)
  runner->submit(op.seq,
                 collectives::ArenaCall{stage.kind, op.data, op.count, op.dtype, op.plan.arena_op, stage.root,
                                        signature, std::move(what), op.plan.arena_segments},
                 deadline);
  resume_arena_waiters(g, rank);
}

ProcAnchor::Found ProcAnchor::find_live(const std::string& group, uint32_t rank, uint64_t seq) {
  auto it = groups_.find(group);
  if (it == groups_.end() || !it->second.broken.ok()) return {};
  auto lr = it->second.ranks.find(rank);
  if (lr == it->second.ranks.end()) return {};
  auto op = lr->second.ops.find(seq);
  return Found{&it->second, &lr->second, op == lr->second.ops.end() ? nullptr : &op->second};
}

void ProcAnchor::handle(const ArenaDone& m) {
  auto [gp, lr, op] = find_live(m.group, m.rank, m.seq);
  if (op == nullptr) return;
  Group& g = *gp;
  if (m.code == 0) {
    g.counters.arena_in_place += m.path != static_cast<uint8_t>(collectives::ArenaPath::slots);
    g.counters.arena_written_in_place += m.path == static_cast<uint8_t>(collectives::ArenaPath::written_in_place);
    op->on_arena = false;
    ++op->stage;
    advance(g, m.rank, m.seq);
    return;
  }
  // Broken by another process: its reason comes from it (GroupBroken) or
  // from its monitor (it died); the collective fails then, with it.
  if (g.arena.arena && g.arena.arena->broken()) return;
  break_group(m.group, Status(failure_code(m.code), m.why), /*tell_others=*/true);
}

void ProcAnchor::offer_slots(Group& g, uint32_t rank) {
  auto segment = collectives::SlotSegment::create(kSlots, g.spec.chunk_bytes);
  if (!segment) {
    TROUPE_LOG(info, "event=collective_slots_unavailable group={} rank={} reason=\"{}\"", g.spec.id, rank,
               segment.error().message());
    return;
  }
  uint32_t prev = (rank + g.spec.size - 1) % g.spec.size;
  (void)g.engines[prev].tell(SlotsOffered{g.spec.id, prev, rank, segment->offer()});
  g.inboxes[rank] = std::move(*segment);
}

void ProcAnchor::handle(const SlotsOffered& m) {
  Group& g = groups_[m.group];  // the offer may come before this engine's JoinGroup
  if (!g.broken.ok() || g.outboxes.count(m.to_rank)) return;
  auto segment = collectives::SlotSegment::open(m.offer);
  if (!segment) {
    // Another host (or no access): chunks go in messages, as they would.
    TROUPE_LOG(debug, "event=collective_slots_unreachable group={} rank={} reason=\"{}\"", m.group, m.to_rank,
               segment.error().message());
    return;
  }
  Group::Outbox& out = g.outboxes[m.to_rank];
  out.owner = m.from_rank;
  for (uint32_t i = segment->slots(); i-- > 0;) out.free.push_back(i);
  out.segment = std::move(*segment);
}

Result<void> ProcAnchor::handle(const LeaveGroup& m) {
  std::erase_if(pending_arenas_, [&](const auto& e) { return e.first == m.group; });
  if (!groups_.count(m.group)) return {};  // never joined here, or released already
  break_group(m.group, Status(ErrorCode::not_found, "collectives: group " + m.group + " was released by its driver"),
              /*tell_others=*/false, /*released=*/true);
  groups_.erase(m.group);
  return {};
}

Result<GroupCounters> ProcAnchor::handle(const GroupStats& m) {
  auto it = groups_.find(m.group);
  if (it == groups_.end()) return error(ErrorCode::not_found, "collectives: group " + m.group + " is unknown here");
  return it->second.counters;
}

void ProcAnchor::handle(const SlotFree& m) {
  auto it = groups_.find(m.group);
  if (it == groups_.end() || !it->second.broken.ok()) return;
  Group& g = it->second;
  auto out = g.outboxes.find(m.to_rank);
  if (out == g.outboxes.end() || m.slot >= out->second.segment.slots() ||
      out->second.free.size() >= out->second.segment.slots()) {
    break_group(m.group, Status(ErrorCode::malformed, "collectives: group " + m.group + ": rank " +
                                                          std::to_string(m.to_rank) + " got back a slot it never used"),
                /*tell_others=*/true);
    return;
  }
  out->second.free.push_back(m.slot);
  // Ring collectives of that rank waiting for a slot go on, oldest first.
  auto lr = g.ranks.find(m.to_rank);
  if (lr == g.ranks.end()) return;
  std::vector<uint64_t> waiting;
  for (auto& [seq, op] : lr->second.ops) {
    if (!op.schedule.steps.empty()) waiting.push_back(seq);
  }
  for (uint64_t seq : waiting) pump(g, m.to_rank, seq);
}

Deferred<void> ProcAnchor::handle(const Collective& m) {
  auto reply = defer<void>();
  auto it = groups_.find(m.group);
  if (it == groups_.end()) {
    reply.fail(Status(ErrorCode::not_found, "allreduce: group " + m.group + " is unknown in this process"));
    return reply;
  }
  Group& g = it->second;
  if (!g.broken.ok()) {
    reply.fail(g.broken);
    return reply;
  }
  auto lr = g.ranks.find(m.rank);
  if (lr == g.ranks.end()) {
    reply.fail(Status(ErrorCode::invalid_argument, "allreduce: rank " + std::to_string(m.rank) + " of group " +
                                                       m.group + " is not in this process"));
    return reply;
  }
  if (m.count > 0 && m.data == nullptr) {
    reply.fail(Status(ErrorCode::invalid_argument, "allreduce: no data"));
    return reply;
  }
  if (m.kind == CollectiveKind::broadcast && m.root >= g.spec.size) {
    reply.fail(Status(ErrorCode::invalid_argument, "broadcast: root " + std::to_string(m.root) + " is not a rank of " +
                                                       m.group + " (" + std::to_string(g.spec.size) + " ranks)"));
    return reply;
  }
  // CUDA memory goes to NCCL, which needs one rank per process (one GPU
  // each) and, for the segmented kinds, a count the ranks divide.
  bool gpu = false;
  if (m.count > 0) {
    auto on_device = collectives::NcclComm::is_device_pointer(m.data);
    if (!on_device) {
      reply.fail(Status(on_device.error().code(), "collectives: group " + m.group + ": " + on_device.error().message()));
      return reply;
    }
    gpu = *on_device;
  }
  if (gpu) {
    if (g.ranks.size() != 1) {
      reply.fail(Status(ErrorCode::invalid_argument,
                        "collectives: group " + m.group + ": collectives on CUDA memory (NCCL) need one rank per "
                        "process, and this one hosts " + std::to_string(g.ranks.size()) +
                        "; make the group of a mesh with one member per process"));
      return reply;
    }
    if (auto seg = collectives::nccl_in_place_segment(m.kind, m.count, g.spec.size, m.rank); !seg) {
      reply.fail(seg.error());
      return reply;
    }
  }
  // A large allreduce over several hosts runs as pieces, pipelined: piece
  // j + 1's reduce_scatter in the arena while piece j is between the hosts.
  // Every rank cuts the same pieces (they depend on the count, the type, the
  // group's chunk size and layout only), so the pieces' sequence numbers
  // match across ranks.
  size_t pieces = gpu ? 1 : pipeline_pieces(g, m.kind, m.count, m.dtype);
  const size_t width = dtype_size(m.dtype);
  std::string id = m.group;
  uint32_t rank = m.rank;
  auto left = pieces > 1 ? std::make_shared<size_t>(pieces) : nullptr;
  // What every rank must agree on (see RingChunk::signature), and its words.
  const std::string call = std::to_string(static_cast<int>(m.kind)) + "/" + std::to_string(m.count) + "/" +
                           std::to_string(static_cast<int>(m.dtype)) + "/" + std::to_string(static_cast<int>(m.op)) +
                           "/" + std::to_string(m.root);
  const std::string what = std::string(kind_name(m.kind)) + " of " + std::to_string(m.count) + " " +
                           std::string(dtype_name(m.dtype)) + " (" + std::string(op_name(m.op)) +
                           (m.kind == CollectiveKind::broadcast ? ", root " + std::to_string(m.root) : "");
  std::vector<uint64_t> seqs;
  std::vector<std::vector<size_t>> arena_stages;  // by piece: its arena stages' indices
  for (size_t j = 0; j < pieces; ++j) {
    collectives::ElemRange part = collectives::ring_segment(m.count, pieces, j);
    uint64_t seq = lr->second.next_seq++;
    seqs.push_back(seq);
    Op& op = lr->second.ops[seq];
    op.seq = seq;
    op.kind = m.kind;
    op.gpu = gpu;
    op.root = m.root;
    op.pieces_left = left;
    arena_stages.emplace_back();
    if (!gpu) {  // NCCL runs its own
      op.plan = collectives::plan_collective(g.layout, m.rank, m.kind, part.len_elems, m.op, m.root);
      for (size_t k = 0; k < op.plan.stages.size(); ++k) {
        const collectives::Stage& stage = op.plan.stages[k];
        if (stage.where == collectives::StageWhere::net) {
          set_net_steps(op, stage, g.spec.chunk_bytes / width);
          // Its turn on each edge comes after the collectives called before.
          for (uint32_t child : op.tree.children) lr->second.tree_edges[child].sending.insert(seq);
        }
        if (stage.where == collectives::StageWhere::arena) arena_stages.back().push_back(k);
      }
    }
    std::string piece = pieces > 1 ? ", piece " + std::to_string(j + 1) + " of " + std::to_string(pieces) : "";
    op.signature = codec::type_id(call + piece);
    op.what = what + piece + ")";
    op.data = static_cast<std::byte*>(m.data) + part.offset_elems * width;
    op.count = part.len_elems;
    op.dtype = m.dtype;
    op.op = m.op;
    op.reply = reply;
    // Bounded: past the group's deadline the collective fails on this rank,
    // and the group is broken (the other ranks fail too: they wait on it).
    after(std::chrono::milliseconds(g.spec.timeout_ms), [this, id, rank, seq] {
      auto gi = groups_.find(id);
      if (gi == groups_.end()) return;
      auto li = gi->second.ranks.find(rank);
      if (li == gi->second.ranks.end() || !li->second.ops.count(seq)) return;
      break_group(id,
                  Status(ErrorCode::timeout, "collectives: a collective of group " + id + " did not complete within " +
                                                 std::to_string(gi->second.spec.timeout_ms) + " ms"),
                  /*tell_others=*/true);
    });
  }
  // The arena stages' order: a collective's after the ones called before;
  // a pipelined one's by diagonals (piece j's i-th arena stage at j + i,
  // the earlier stage first), so piece j + 1's first goes before piece j's
  // second: reduce_scatter 0, reduce_scatter 1, allgather 0, reduce_scatter 2,
  // allgather 1, ... The host's other ranks cut the same pieces and plans.
  size_t most = 0;
  for (const auto& stages : arena_stages) most = std::max(most, stages.size());
  for (size_t t = 0; t + 1 < pieces + most; ++t) {
    for (size_t i = 0; i <= t && i < most; ++i) {
      size_t j = t - i;
      if (j < pieces && i < arena_stages[j].size()) lr->second.arena_order.emplace_back(seqs[j], arena_stages[j][i]);
    }
  }
  if (gpu) {
    gpu_progress(id);
  } else {
    // What came before the call is checked now: some of it may be from a
    // sender that this rank's plan never reads from (another kind, or a
    // count that gives another broadcast shape), and would wait unread.
    for (uint64_t seq : seqs) {
      if (!g.broken.ok() || !parked_agree(g, lr->second, lr->second.ops.at(seq))) break;
    }
    for (uint64_t seq : seqs) {
      if (!g.broken.ok()) break;
      advance(g, rank, seq);
    }
  }
  return reply;
}

bool ProcAnchor::parked_agree(Group& g, LocalRank& lr, const Op& op) {
  for (auto it = lr.early.lower_bound({op.seq, 0}); it != lr.early.end() && it->first.first == op.seq; ++it) {
    if (!agrees(g, op, it->second.signature, it->second.from)) return false;
  }
  for (auto it = lr.early_from.lower_bound({op.seq, 0, 0});
       it != lr.early_from.end() && std::get<0>(it->first) == op.seq; ++it) {
    if (!agrees(g, op, it->second.signature, it->second.from) || !expected_tree_chunk(g, op, it->second.from, std::get<2>(it->first))) {
      return false;
    }
  }
  return true;
}

bool ProcAnchor::expected_tree_chunk(Group& g, const Op& op, uint32_t from, uint64_t chunk) {
  // A barrier's tokens come from its schedule's peers, checked as it goes.
  if (op.kind != CollectiveKind::broadcast) return true;
  const TreeBroadcast& t = op.tree;
  if (t.parent == from && chunk < t.chunks.size()) return true;
  break_group(g.spec.id, Status(ErrorCode::malformed, "collectives: group " + g.spec.id + ": rank " +
                                                          std::to_string(from) + " sent chunk " + std::to_string(chunk) +
                                                          " of " + op.what + ", which this rank takes " +
                                                          (t.parent ? "from rank " + std::to_string(*t.parent) + " in " +
                                                                          std::to_string(t.chunks.size()) + " chunks"
                                                                    : std::string("from no one")) ),
              /*tell_others=*/true);
  return false;
}

size_t ProcAnchor::pipeline_pieces(const Group& g, CollectiveKind kind, size_t count, DType dtype) {
  // Only where there is a net stage to overlap the arenas with: a group
  // over several hosts with an arena on some. From the group's layout only,
  // which every rank has alike (whether this process holds an arena is not).
  bool arenas = false;
  for (uint32_t h = 0; h < g.layout.hosts(); ++h) arenas = arenas || g.layout.ranks_on(h).size() > 1;
  if (kind != CollectiveKind::allreduce || g.layout.hosts() < 2 || !arenas) return 1;
  // Pieces of at least two chunks a rank: the arena moves a chunk a rank per
  // round, the rings between hosts pipeline chunks of their own.
  uint64_t piece_bytes = 2 * g.spec.chunk_bytes;
  uint64_t bytes = count * dtype_size(dtype);
  return static_cast<size_t>(std::clamp<uint64_t>(bytes / piece_bytes, 1, g.spec.pipeline_pieces));
}

void ProcAnchor::set_net_steps(Op& op, const collectives::Stage& stage, size_t chunk_elems) {
  const collectives::NetPart& part = op.plan.net;
  size_t members = part.members.size();
  chunk_elems = std::max<size_t>(1, chunk_elems);
  auto ring = [&](collectives::RingSchedule s) {
    // The schedule is over the members and the runs' concatenation: to
    // group ranks, and to elements of the whole buffer.
    s.send_to = part.members[s.send_to];
    s.recv_from = part.members[s.recv_from];
    for (auto& step : s.steps) {
      step.send = part.to_buffer(step.send);
      step.recv = part.to_buffer(step.recv);
    }
    op.schedule = std::move(s);
  };
  switch (stage.kind) {
    case CollectiveKind::allreduce:
      ring(collectives::ring_allreduce_schedule(members, part.index, part.len_elems(), chunk_elems));
      break;
    case CollectiveKind::reduce_scatter:
      ring(collectives::ring_reduce_scatter_schedule(members, part.index, part.len_elems(), chunk_elems));
      break;
    case CollectiveKind::allgather:
      ring(collectives::ring_allgather_schedule(members, part.index, part.len_elems(), chunk_elems));
      break;
    case CollectiveKind::broadcast: {
      // At least one chunk, so that even an empty broadcast is matched
      // (signatures) and ordered like any other.
      size_t count = part.len_elems();
      size_t chunks = std::max<size_t>(1, (count + chunk_elems - 1) / chunk_elems);
      collectives::BroadcastTree shape = collectives::broadcast_tree(members, stage.root, part.index, chunks);
      if (shape.parent) op.tree.parent = part.members[*shape.parent];
      for (size_t child : shape.children) op.tree.children.push_back(part.members[child]);
      for (size_t c = 0; c < chunks; ++c) {
        op.tree.chunks.push_back(part.to_buffer(collectives::ring_segment(count, chunks, c)));
      }
      op.tree.sent.assign(op.tree.children.size(), 0);
      break;
    }
    case CollectiveKind::barrier:
      for (auto& r : collectives::barrier_schedule(members, part.index)) {
        op.peer_steps.push_back(PeerStep{part.members[r.send_to], true});
        op.peer_steps.push_back(PeerStep{part.members[r.recv_from], false});
      }
      break;
  }
}

bool ProcAnchor::in_net_stage(const Op& op) {
  return op.stage < op.plan.stages.size() && op.plan.stages[op.stage].where == collectives::StageWhere::net;
}

void ProcAnchor::advance(Group& g, uint32_t rank, uint64_t seq) {
  LocalRank& lr = g.ranks[rank];
  auto it = lr.ops.find(seq);
  if (it == lr.ops.end()) return;
  Op& op = it->second;
  if (op.stage >= op.plan.stages.size()) return finish(g, rank, seq);
  const collectives::Stage& stage = op.plan.stages[op.stage];
  if (stage.where == collectives::StageWhere::arena) {
    bool turn = !lr.arena_order.empty() && lr.arena_order.front() == std::make_pair(seq, op.stage);
    if (op.on_arena || !turn) return;  // resume_arena_waiters() goes on with it at its turn
    return run_on_arena(g, rank, op);
  }
  if (stage.kind == CollectiveKind::broadcast) return pump_tree(g, rank, seq);
  if (stage.kind == CollectiveKind::barrier) return pump_peers(g, rank, seq);
  pump(g, rank, seq);
}

void ProcAnchor::net_done(Group& g, uint32_t rank, uint64_t seq) {
  Op& op = g.ranks[rank].ops.at(seq);
  if (auto avg = op.plan.average) {
    collectives::finish_avg(op.dtype, op.data + avg->offset_elems * dtype_size(op.dtype), avg->len_elems,
                            g.spec.size);
  }
  ++op.stage;
  advance(g, rank, seq);
}

bool ProcAnchor::apply(Group& g, uint32_t rank, Op& op, size_t step, uint32_t from, const troupe::Bytes& bytes,
                       uint32_t slot, uint64_t slot_bytes) {
  const collectives::RingStep& s = op.schedule.steps[step];
  size_t width = dtype_size(op.dtype);
  const std::byte* src = reinterpret_cast<const std::byte*>(bytes.data());
  size_t have = bytes.size();
  if (slot > 0) {
    auto inbox = g.inboxes.find(rank);
    if (inbox == g.inboxes.end() || slot > inbox->second.slots() || slot_bytes > inbox->second.slot_bytes()) {
      break_group(g.spec.id, Status(ErrorCode::malformed, "collectives: group " + g.spec.id + ": rank " +
                                                              std::to_string(from) + " wrote to slot " +
                                                              std::to_string(slot) + ", which rank " +
                                                              std::to_string(rank) + " never offered"),
                  /*tell_others=*/true);
      return false;
    }
    src = inbox->second.slot(slot - 1);
    have = slot_bytes;
  }
  std::byte* at = op.data + s.recv.offset_elems * width;
  size_t n = std::min(s.recv.len_elems, have / width);
  if (slot > 0) {
    ++g.counters.chunks_in_slots;
  } else if (have > 0) {
    ++g.counters.chunks_in_messages;
    g.counters.bytes_in_messages += have;
  }
  if (s.recv_mode == collectives::RecvMode::reduce) {
    if (!reduce_and_send(g, rank, op, step, src, n)) collectives::reduce_into(op.dtype, op.op, at, src, n);
  } else {
    std::memcpy(at, src, n * width);
  }
  if (slot > 0) (void)g.engines[from].tell(SlotFree{g.spec.id, from, slot - 1});
  return true;
}

ProcAnchor::Group::Outbox* ProcAnchor::outbox_for(Group& g, uint32_t rank, uint32_t to, size_t bytes) {
  auto out = g.outboxes.find(rank);
  if (bytes == 0 || out == g.outboxes.end() || out->second.owner != to || bytes > out->second.segment.slot_bytes()) {
    return nullptr;
  }
  return &out->second;
}

ProcAnchor::TakenSlot ProcAnchor::take_slot(Group::Outbox& out) {
  if (out.free.empty()) return {};
  uint32_t slot = out.free.back();
  out.free.pop_back();
  return TakenSlot{slot + 1, out.segment.slot(slot)};
}

void ProcAnchor::send_step(Group& g, uint32_t rank, Op& op, uint32_t slot_number, uint64_t slot_bytes,
                           troupe::Bytes bytes) {
  (void)g.engines[op.schedule.send_to].tell(RingChunk{g.spec.id, static_cast<uint32_t>(op.schedule.send_to), rank,
                                                      op.seq, op.next_send, false, op.signature, std::move(bytes),
                                                      slot_number, slot_bytes});
  ++op.next_send;
}

bool ProcAnchor::reduce_and_send(Group& g, uint32_t rank, Op& op, size_t step, const std::byte* in, size_t n) {
  // Only where the partial sum is not needed here again: it goes on to the
  // next rank at step + C, a reduce-scatter step too (the last one's result
  // is this rank's own segment, which it keeps), and that send is the next.
  const auto& steps = op.schedule.steps;
  size_t next = step + op.schedule.chunks_per_step;
  if (n == 0 || next >= steps.size() || op.next_send != next ||
      steps[next].recv_mode != collectives::RecvMode::reduce || steps[next].send != steps[step].recv ||
      n != steps[step].recv.len_elems) {
    return false;
  }
  size_t width = dtype_size(op.dtype);
  Group::Outbox* out = outbox_for(g, rank, static_cast<uint32_t>(op.schedule.send_to), n * width);
  if (out == nullptr) return false;
  TakenSlot to = take_slot(*out);
  if (to.at == nullptr) return false;
  collectives::reduce_to(op.dtype, op.op, to.at, op.data + steps[step].recv.offset_elems * width, in, n);
  send_step(g, rank, op, to.number, n * width);
  ++g.counters.reduced_into_slots;
  return true;
}

void ProcAnchor::pump(Group& g, uint32_t rank, uint64_t seq) {
  LocalRank& lr = g.ranks[rank];
  auto it = lr.ops.find(seq);
  if (it == lr.ops.end()) return;
  Op& op = it->second;
  if (!in_net_stage(op)) return;  // its data waits in `early` until then
  const auto& steps = op.schedule.steps;
  size_t width = dtype_size(op.dtype);
  for (;;) {
    // Data that came before this rank called (or before its turn).
    auto early = lr.early.find({seq, op.next_recv});
    if (op.next_recv < steps.size() && op.next_recv < op.next_send && early != lr.early.end()) {
      const LocalRank::Early& e = early->second;
      if (!agrees(g, op, e.signature, e.from) ||
          !apply(g, rank, op, op.next_recv, e.from, e.bytes, e.slot, e.slot_bytes)) {
        return;
      }
      lr.early.erase(early);
      ++op.next_recv;
      continue;
    }
    // A send may read what was received C steps before it.
    if (op.next_send < steps.size() && op.next_send < op.next_recv + op.schedule.chunks_per_step) {
      const collectives::RingStep& s = steps[op.next_send];
      const std::byte* src = op.data + s.send.offset_elems * width;
      size_t bytes = s.send.len_elems * width;
      if (Group::Outbox* out = outbox_for(g, rank, static_cast<uint32_t>(op.schedule.send_to), bytes)) {
        TakenSlot to = take_slot(*out);
        if (to.at == nullptr) break;  // goes on when the next rank gives one back (SlotFree)
        std::memcpy(to.at, src, bytes);
        send_step(g, rank, op, to.number, bytes);
      } else {
        send_step(g, rank, op, 0, 0, troupe::Bytes::copy(src, bytes));
      }
      continue;
    }
    break;
  }
  if (op.next_recv == steps.size() && op.next_send == steps.size()) net_done(g, rank, seq);
}

void ProcAnchor::pump_peers(Group& g, uint32_t rank, uint64_t seq) {
  LocalRank& lr = g.ranks[rank];
  auto it = lr.ops.find(seq);
  if (it == lr.ops.end()) return;
  Op& op = it->second;
  if (!in_net_stage(op)) return;  // its tokens wait in `early_from` until then
  while (op.next_peer_step < op.peer_steps.size()) {
    const PeerStep& s = op.peer_steps[op.next_peer_step];
    if (s.send) {
      (void)g.engines[s.peer].tell(RingChunk{g.spec.id, s.peer, rank, seq, 0, true, op.signature, {}, 0, 0});
    } else {
      auto got = lr.early_from.find({seq, s.peer, 0});
      if (got == lr.early_from.end()) return;  // its token has not come yet
      if (!agrees(g, op, got->second.signature, got->second.from)) return;
      lr.early_from.erase(got);
    }
    ++op.next_peer_step;
  }
  net_done(g, rank, seq);
}

void ProcAnchor::pump_tree(Group& g, uint32_t rank, uint64_t seq) {
  LocalRank& lr = g.ranks[rank];
  auto it = lr.ops.find(seq);
  if (it == lr.ops.end()) return;
  Op& op = it->second;
  if (!in_net_stage(op)) return;  // its chunks wait in `early_from` until then
  TreeBroadcast& t = op.tree;
  const size_t width = dtype_size(op.dtype);
  // The parent's chunks, in order.
  const size_t received_before = t.received;
  while (t.parent && t.received < t.chunks.size()) {
    auto got = lr.early_from.find({seq, *t.parent, t.received});
    if (got == lr.early_from.end()) break;  // not here yet
    if (!agrees(g, op, got->second.signature, got->second.from)) return;
    const collectives::ElemRange& c = t.chunks[t.received];
    const troupe::Bytes& bytes = got->second.bytes;
    if (bytes.size() != c.len_elems * width) {
      break_group(g.spec.id, Status(ErrorCode::malformed, "collectives: group " + g.spec.id + ": rank " +
                                                              std::to_string(*t.parent) + " sent " +
                                                              std::to_string(bytes.size()) + " bytes as chunk " +
                                                              std::to_string(t.received) + " of " + op.what +
                                                              ", which has " + std::to_string(c.len_elems * width)),
                  /*tell_others=*/true);
      return;
    }
    if (!bytes.empty()) {
      std::memcpy(op.data + c.offset_elems * width, bytes.data(), bytes.size());
      ++g.counters.chunks_in_messages;
    }
    g.counters.bytes_in_messages += bytes.size();
    lr.early_from.erase(got);
    ++t.received;
  }
  // One acknowledgement for all of them: it carries the count, not the chunk.
  if (t.received > received_before) {
    (void)g.engines[*t.parent].tell(TreeAck{g.spec.id, *t.parent, rank, seq, t.received});
  }
  // On to the children, as far as each one's window goes.
  const size_t have = t.parent ? t.received : t.chunks.size();
  bool all_sent = have == t.chunks.size();
  // One copy of a chunk serves every child it goes to in this call.
  std::map<size_t, troupe::Bytes> copies;
  auto chunk_bytes = [&](size_t i) -> const troupe::Bytes& {
    auto [it, fresh] = copies.try_emplace(i);
    if (fresh) {
      const collectives::ElemRange& c = t.chunks[i];
      it->second = troupe::Bytes::copy(op.data + c.offset_elems * width, c.len_elems * width);
    }
    return it->second;
  };
  std::vector<uint64_t> next;  // collectives whose turn on an edge comes now
  for (size_t k = 0; k < t.children.size(); ++k) {
    TreeEdge& edge = lr.tree_edges[t.children[k]];
    if (edge.sending.empty() || *edge.sending.begin() != seq) continue;  // an earlier collective's turn
    while (t.sent[k] < have && edge.in_flight < kTreeWindow) {
      (void)g.engines[t.children[k]].tell(RingChunk{g.spec.id, t.children[k], rank, seq, t.sent[k], true,
                                                    op.signature, chunk_bytes(t.sent[k]), 0, 0});
      ++t.sent[k];
      ++edge.unacked[seq].sent;
      ++edge.in_flight;
    }
    if (t.sent[k] == t.chunks.size()) {
      edge.sending.erase(seq);
      if (!edge.sending.empty()) next.push_back(*edge.sending.begin());
    }
    all_sent = all_sent && t.sent[k] == t.chunks.size();
  }
  // The children's last acknowledgements are not waited for: every chunk
  // is in a message by now, and the caller's buffer is its own again (the
  // edges count them until they come).
  if (all_sent) net_done(g, rank, seq);
  for (uint64_t later : next) {
    if (!g.broken.ok()) return;
    pump_tree(g, rank, later);
  }
}

void ProcAnchor::handle(const TreeAck& m) {
  auto [g, lr, op] = find_live(m.group, m.to_rank, m.seq);
  if (g == nullptr) return;
  auto edge = lr->tree_edges.find(m.from_rank);
  TreeEdge::Sent* sent = nullptr;
  if (edge != lr->tree_edges.end()) {
    auto it = edge->second.unacked.find(m.seq);
    if (it != edge->second.unacked.end()) sent = &it->second;
  }
  if (sent == nullptr || m.chunks > sent->sent) {
    // A collective done here whose chunks were all acknowledged: a repeat.
    if (op == nullptr) return;
    // Acknowledgements come only after chunks that agreed (signatures), so
    // one from a rank that is not a child, or for more than was sent, is
    // from a confused peer.
    const TreeBroadcast& t = op->tree;
    auto child = std::find(t.children.begin(), t.children.end(), m.from_rank);
    break_group(m.group, Status(ErrorCode::malformed,
                                "collectives: group " + m.group + ": rank " + std::to_string(m.from_rank) +
                                    " acknowledged " + std::to_string(m.chunks) + " chunks of " + op->what + ", " +
                                    (child == t.children.end()
                                         ? std::string("which this rank does not send it")
                                         : "of " + std::to_string(sent ? sent->sent : 0) + " sent")),
                /*tell_others=*/true);
    return;
  }
  TreeEdge& e = edge->second;
  if (m.chunks > sent->acked) {
    e.in_flight -= m.chunks - sent->acked;
    sent->acked = m.chunks;
  }
  if (sent->acked == sent->sent && !e.sending.count(m.seq)) e.unacked.erase(m.seq);
  // The window has room again: for whichever collective's turn it is on
  // this edge (this one's, or a later one's once this one sent all).
  if (!e.sending.empty()) pump_tree(*g, m.to_rank, *e.sending.begin());
}

void ProcAnchor::finish(Group& g, uint32_t rank, uint64_t seq) {
  LocalRank& lr = g.ranks[rank];
  auto it = lr.ops.find(seq);
  if (it == lr.ops.end()) return;
  Op& op = it->second;
  // A pipelined collective is done (and counted) with its last piece.
  if (op.pieces_left) ++g.counters.pipelined_pieces;
  bool whole = !op.pieces_left || --*op.pieces_left == 0;
  if (whole && std::any_of(op.plan.stages.begin(), op.plan.stages.end(), [](const collectives::Stage& s) {
        return s.where == collectives::StageWhere::arena;
      })) {
    ++g.counters.arena_collectives;
    if (g.layout.hosts() > 1) ++g.counters.hierarchical_collectives;
  }
  Deferred<void> reply = op.reply;
  lr.ops.erase(it);
  if (whole) reply.complete();
  resume_arena_waiters(g, rank);
}

void ProcAnchor::handle(const RingChunk& m) {
  auto [gp, lr, op] = find_live(m.group, m.to_rank, m.seq);
  if (gp == nullptr) return;
  Group& g = *gp;
  if (op == nullptr && m.seq < lr->next_seq) return;  // for a collective done here: no peer sends after that
  // Checked on arrival (what came before the call is checked at the call,
  // parked_agree): a rank in another collective (kind, count, ...) may send
  // what this rank's plan would never read.
  if (op != nullptr && !agrees(g, *op, m.signature, m.from_rank)) return;
  if (m.tree) {
    if (op != nullptr && !expected_tree_chunk(g, *op, m.from_rank, m.step)) return;
    // Broadcast and barrier: by sender and chunk; applied when the schedule
    // gets there. A broadcast's sender keeps at most kTreeWindow chunks
    // unacknowledged on its edge to this rank (TreeEdge), so this holds at
    // most that many per sender, whichever collectives they are of.
    lr->early_from[{m.seq, m.from_rank, m.step}] = LocalRank::Early{m.signature, m.from_rank, m.bytes, 0, 0};
    g.counters.most_tree_chunks_waiting = std::max<uint64_t>(g.counters.most_tree_chunks_waiting, lr->early_from.size());
    if (op == nullptr) return;
    if (op->kind == CollectiveKind::broadcast) {
      pump_tree(g, m.to_rank, m.seq);
    } else {
      pump_peers(g, m.to_rank, m.seq);
    }
    return;
  }
  if (op == nullptr || op->next_recv != m.step || op->next_recv >= op->next_send) {
    // Before this rank called, or ahead of its turn: kept until then.
    lr->early[{m.seq, m.step}] = LocalRank::Early{m.signature, m.from_rank, m.bytes, m.slot, m.slot_bytes};
    if (op != nullptr) pump(g, m.to_rank, m.seq);
    return;
  }
  if (!agrees(g, *op, m.signature, m.from_rank) ||
      !apply(g, m.to_rank, *op, m.step, m.from_rank, m.bytes, m.slot, m.slot_bytes)) {
    return;
  }
  ++op->next_recv;
  pump(g, m.to_rank, m.seq);
}

bool ProcAnchor::agrees(Group& g, const Op& op, uint64_t signature, uint32_t from) {
  if (signature == op.signature) return true;
  break_group(g.spec.id, Status(ErrorCode::invalid_argument,
                                "collectives: the ranks of group " + g.spec.id + " disagree: rank " + std::to_string(from) +
                                    " is in another collective than this rank's " + op.what +
                                    "; every rank must call the same collectives (kind, count, type, op, root) in "
                                    "the same order"),
              /*tell_others=*/true);
  return false;
}

void ProcAnchor::handle(const GroupBroken& m) {
  break_group(m.group, Status(failure_code(m.code), m.why));
}

void ProcAnchor::break_group(const std::string& id, Status why, bool tell_others, bool released) {
  auto it = groups_.find(id);
  if (it == groups_.end() || !it->second.broken.ok()) return;
  Group& g = it->second;
  g.broken = why;
  if (tell_others) {
    std::set<uint64_t> told;
    for (const AnyRef& e : g.engines) {
      if (e == self() || !told.insert(e.id()).second) continue;
      (void)e.tell(GroupBroken{id, why.message(), static_cast<uint8_t>(why.code())});
    }
  }
  if (released) {
    TROUPE_LOG(debug, "event=collective_group_released group={}", id);
  } else {
    TROUPE_LOG(warn, "event=collective_group_broken group={} reason=\"{}\"", id, why.message());
  }
  std::vector<Deferred<void>> failed;
  for (auto& [rank, lr] : g.ranks) {
    for (auto& [seq, op] : lr.ops) failed.push_back(op.reply);
    lr.ops.clear();
    lr.early.clear();
    lr.early_from.clear();
    lr.tree_edges.clear();
  }
  for (MonitorId m : g.monitors) demonitor(m);
  g.monitors.clear();
  // NCCL's kernels and threads stop (the others abort theirs as they see
  // the group broken), and its shared memory goes (the peers' mappings
  // keep theirs until they too see it broken).
  if (g.gpu.comm) g.gpu.comm->abort();
  // The arena's waits end in every process, and this one's runners stop
  // before the callers hear of it (their buffers are theirs again).
  g.arena.close();
  g.inboxes.clear();
  g.outboxes.clear();
  for (auto& reply : failed) reply.fail(why);
}

}  // namespace mesh
}  // namespace troupe
