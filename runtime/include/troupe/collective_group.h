// Collectives inside a mesh's actors: a group is made by the driver
// (ActorMesh::make_group), each member gets its handle, and calls the
// collective from its handlers without blocking:
//
//   // in a member actor, with group_ the CollectiveGroup it was sent:
//   ask<void>(group_.engine(self()), troupe::AllReduce{group_.id, group_.rank, grads_.data(), grads_.size(),
//                                                      troupe::DType::float32, troupe::ReduceOp::avg})
//       .then([this](troupe::Result<void> r) { ... });
//
// Every member of the group must call the same collectives in the same
// order. The work is done by the engine of each member's process: through
// one shared-memory arena when all the group's processes are on one host,
// otherwise by exchanging the data with the other engines along a ring. A
// collective that cannot complete (a member's process died, the deadline
// passed) fails on every surviving member within a bounded time, never
// hangs; the group is then broken: make a new one once the mesh is whole.
// See docs/meshes.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/actor_ref.h"
#include "troupe/codec.h"
#include "troupe/collectives.h"

namespace troupe {

/// Where a process's collective engine is (Runtime::ref_at).
struct EngineAt {
  std::string address;
  uint64_t id = 0;
  TROUPE_FIELDS(address, id);
};

/// A member's handle on a collective group: the group, its rank in it (the
/// member's index in the mesh view the group was made from), and where
/// every rank's engine is.
struct CollectiveGroup {
  std::string id;
  uint32_t rank = 0;
  uint32_t size = 0;
  std::vector<EngineAt> engines;
  /// How long a collective may take before it fails on every rank.
  int64_t timeout_ms = 30'000;
  /// Ranks whose processes share a host move their data through shared
  /// memory (one copy per chunk); false: always by messages over the
  /// transport (GroupOptions::shared_memory).
  bool shared_memory = true;
  /// The largest piece of a ring step (GroupOptions::chunk_bytes).
  uint64_t chunk_bytes = uint64_t{4} << 20;
  /// The most pieces a large allreduce over several hosts runs in
  /// (GroupOptions::pipeline_pieces).
  uint32_t pipeline_pieces = 32;
  TROUPE_FIELDS(id, rank, size, engines, timeout_ms, shared_memory, chunk_bytes, pipeline_pieces);

  /// The engine of the calling actor's process (`self`: the caller's own
  /// ref, from which its runtime is found); empty when unknown.
  AnyRef engine(const AnyRef& self) const;
};

/// The most pieces GroupOptions::pipeline_pieces may ask for.
inline constexpr uint32_t kMaxPipelinePieces = 64;

/// How ActorMesh::make_group makes a group.
struct GroupOptions {
  /// How long one collective may take before it fails on every rank.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  /// Engines on one host exchange chunks through shared memory (the next
  /// rank's slots, mapped by the rank before it); false keeps every chunk
  /// in messages over the transport, as between hosts (to compare the two).
  bool shared_memory = true;
  /// When every rank's process can map one shared segment (all on one host,
  /// with shared_memory), collectives on CPU memory skip the ring: each rank
  /// copies its buffer into the group's arena, reduces its own share of
  /// every rank's data there, and copies the results out (each buffer read
  /// and written once). False: the ring, as between hosts.
  bool host_arena = true;
  /// The largest piece a ring step or a broadcast sends at once (4 KiB to
  /// 64 MiB): a segment of more is pipelined in chunks of this size, each
  /// rank offers the one before it 8 slots of it, and a broadcast's sender
  /// has at most 4 chunks on an edge that the receiver has not applied. Large enough to amortise a
  /// message, small enough that several are in flight. In the arena, the
  /// data a rank moves per round (at most 32 MiB of slots in all).
  uint64_t chunk_bytes = uint64_t{4} << 20;
  /// Over several hosts, an allreduce of at least two chunks a piece runs
  /// in up to this many pieces (1 to kMaxPipelinePieces), pipelined: piece
  /// j + 1 is reduced in the hosts' arenas while piece j goes between the
  /// hosts. 1: in one piece, its stages one after another.
  uint32_t pipeline_pieces = 32;
};

/// Which collective a Collective message asks for.
enum class CollectiveKind : uint8_t {
  /// Every rank ends with the reduction (`op`) of all ranks' buffers.
  allreduce,
  /// Rank r ends with the reduction of its segment of the buffer: elements
  /// [r*q + min(r, m), ...) of length q + (r < m), q = count / n and
  /// m = count % n (the rest of its buffer is unspecified: partial results,
  /// or its input where a partial result went straight on to the next rank).
  reduce_scatter,
  /// Rank r contributes its segment (as above) of the buffer; every rank
  /// ends with every segment.
  allgather,
  /// Every rank ends with `root`'s buffer (a binomial tree).
  broadcast,
  /// Returns once every rank has entered it (no data).
  barrier,
};

/// The kind's name ("allreduce", "reduce_scatter", ...), for logs, errors
/// and metrics.
constexpr std::string_view kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::allreduce: return "allreduce";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::allgather: return "allgather";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::barrier: return "barrier";
  }
  return "collective";
}

/// Asks the local engine to run a collective on `count` elements at `data`,
/// in place, with the group's other ranks. The memory must stay valid, and
/// untouched by the caller, until the answer (once done on this rank, or
/// with why not). Every rank must pass the same kind, count, type, op and
/// root, in the same order of collectives.
struct Collective {
  std::string group;
  uint32_t rank = 0;
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::float32;
  ReduceOp op = ReduceOp::sum;
  CollectiveKind kind = CollectiveKind::allreduce;
  uint32_t root = 0;
};
/// The common case: `AllReduce{group.id, group.rank, data, count, dtype, op}`.
using AllReduce = Collective;

}  // namespace troupe
