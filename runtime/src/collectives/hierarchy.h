// How a collective runs on a group whose ranks are spread over hosts: in
// stages, some inside each host's arena (collectives/host_arena.h), one
// between the engines of a few ranks over the transport (a ring or a tree,
// collectives/ring.h). What NCCL does between NVLink islands and MPI's
// hierarchical collectives do between nodes: the slow links carry as little
// as possible, the host's memory the rest.
//
// With H hosts of L ranks each, an allreduce of S bytes runs as
//   1. a reduce_scatter in each host's arena: local rank i holds the host's
//      sum of local segment i (S/L bytes);
//   2. a ring allreduce of segment i among the H ranks with local index i,
//      one per host ("column" i): L rings side by side, each rank sending
//      2(H-1)/H of S/L over the network instead of the flat ring's
//      2(n-1)/n of S;
//   3. an allgather in each host's arena.
// Hosts with different numbers of ranks run instead an allreduce in each
// arena, a ring allreduce of the whole buffer among the hosts' first ranks
// (their leaders), and a broadcast from the leader in each arena.
// reduce_scatter and allgather on such hosts work by columns too, on the
// ranks' own segments: rank r's segment (ring_segment over all n ranks) is
// what it gets or gives, and column i's segments (of the ranks with local
// index i, in rank order) are local rank i's share of the arena, a few runs
// of the buffer. reduce_scatter is a reduce_scatter in each arena (local
// rank i then holds its host's sum of column i's segments) and a ring
// reduce_scatter among column i's ranks; allgather is a ring allgather among
// column i's ranks, then an allgather in each arena. Each rank sends (H-1)
// segments between hosts, (H-1)S in all for S bytes a rank, the least
// possible: the flat ring over ranks laid out host by host sends H(n-1)/n S.
// On uneven hosts reduce_scatter runs as the leaders' allreduce (each rank's
// segment is then right) and allgather as the flat ring over all ranks.
// broadcast is a tree among the leaders (the root leads its host) and a
// broadcast in each arena; barrier is a barrier in each arena, one among the
// leaders, and one more in each arena.
//
// A layout where every host has a single rank is the flat case: one stage,
// the ring or tree over all ranks, exactly as without arenas; a layout with
// one host is the single arena, one stage. So every CPU collective of a
// group runs from a plan, whatever its layout.
//
// Results are the same bits on every rank: each element is combined on one
// rank (in a fixed order) and copied to the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "collectives/ring.h"
#include "troupe/collective_group.h"
#include "troupe/collectives.h"
#include "troupe/status.h"

namespace troupe::collectives {

/// Which host (which arena) each rank of a group is on.
class GroupLayout {
 public:
  /// Every rank on a host of its own: no arenas, the flat ring and tree.
  static GroupLayout flat(uint32_t ranks);
  /// From each rank's host, as any labels (the driver's host numbers);
  /// hosts are renumbered in order of their first rank, local indices go in
  /// rank order. invalid_argument when empty.
  static Result<GroupLayout> make(const std::vector<uint32_t>& host_of_rank);

  uint32_t ranks() const { return static_cast<uint32_t>(host_of_.size()); }
  uint32_t hosts() const { return static_cast<uint32_t>(ranks_on_.size()); }
  /// Host `rank` is on (0 for rank 0's host, and so on).
  uint32_t host_of(uint32_t rank) const { return host_of_[rank]; }
  /// `rank`'s place among its host's ranks: its rank in the host's arena.
  uint32_t local_index(uint32_t rank) const { return local_index_[rank]; }
  /// The ranks on `host`, in rank order.
  const std::vector<uint32_t>& ranks_on(uint32_t host) const { return ranks_on_[host]; }
  /// True when every host has the same number of ranks.
  bool uniform() const;
  /// The host numbers (host_of for every rank): what a JoinGroup carries.
  const std::vector<uint32_t>& host_numbers() const { return host_of_; }

 private:
  std::vector<uint32_t> host_of_;
  std::vector<uint32_t> local_index_;
  std::vector<std::vector<uint32_t>> ranks_on_;
};

/// Where a stage of a plan runs.
enum class StageWhere : uint8_t {
  arena,  ///< among the ranks of this rank's host, in its arena
  net,    ///< among plan.net.members, between their engines
};

/// One stage of a rank's plan.
struct Stage {
  StageWhere where = StageWhere::arena;
  CollectiveKind kind = CollectiveKind::allreduce;
  /// broadcast: the root, as a local index (arena) or an index into
  /// plan.net.members (net).
  uint32_t root = 0;

  bool operator==(const Stage&) const = default;
};

/// The ranks a plan's net stage runs among, and on which elements.
struct NetPart {
  /// Group ranks, in ring (or tree) order.
  std::vector<uint32_t> members;
  /// This rank's place in members.
  uint32_t index = 0;
  /// The elements the stage works on: the concatenation of these runs of
  /// the buffer, in order. Ring segments are cut from the concatenation
  /// (members[k] owns segment k of it), and every segment lies within one
  /// run: one run, or a run per member that is exactly its segment.
  std::vector<ElemRange> runs;

  /// The elements of the concatenation.
  size_t len_elems() const;
  /// Where elements [offset, offset + len) of the concatenation are in the
  /// buffer. REQUIRES: they lie within one run (aborts otherwise); an empty
  /// range maps to an empty one.
  ElemRange to_buffer(ElemRange in_runs) const;
};

/// What one rank does for one collective.
struct CollectivePlan {
  /// In order; at most one is net.
  std::vector<Stage> stages;
  /// The net stage's ranks and elements (when it has one).
  NetPart net;
  /// The arena stages' layout: arena_segments[i] is local rank i's segment
  /// (what it holds after a reduce_scatter, gives to an allgather), as runs
  /// of the buffer in order. Empty: ring_segment's layout of the whole
  /// buffer over the host's ranks.
  std::vector<std::vector<ElemRange>> arena_segments;
  /// The op the arena stages combine with: the collective's, except sum for
  /// avg when the average is taken later (average below).
  ReduceOp arena_op = ReduceOp::sum;
  /// For avg: the elements to divide by the group's size once the net stage
  /// is done (the arena of a single-host group divides by itself).
  std::optional<ElemRange> average;
};

/// The plan of rank `rank` for a collective of `count_elems` elements.
/// Every rank of the layout computes its own, and together they give every
/// rank the collective's result (collective_group.h's CollectiveKind).
/// REQUIRES: rank < layout.ranks(); for broadcast, root < layout.ranks().
CollectivePlan plan_collective(const GroupLayout& layout, uint32_t rank, CollectiveKind kind, size_t count_elems,
                               ReduceOp op, uint32_t root);

}  // namespace troupe::collectives
