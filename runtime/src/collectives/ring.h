// The schedules of the CPU collectives, as data: for one rank of a mesh,
// which element ranges to send to and receive from which peer, in what order.
// Pure functions of (ranks, rank, count, chunk size), so every rank computes
// its own part without talking to the others, the transport only executes
// steps, and the tests run all ranks of a mesh in one process.
//
//   ring       allreduce = reduce_scatter then allgather; each rank sends
//              2(n-1)/n of the buffer whatever n is (bandwidth-optimal).
//   tree       broadcast down a binomial tree: ceil(log2 n) rounds; a large
//              one cut in chunks, pipelined down that tree or a chain
//              (broadcast_tree).
//   barrier    dissemination: ceil(log2 n) rounds of one send and one recv.
//
// Ring layout. The buffer of `count` elements is cut into n segments, sizes
// differing by at most one, the longer ones first:
//
//   len(s)    = count / n + (s < count % n ? 1 : 0)
//   offset(s) = s * (count / n) + min(s, count % n)
//
// (count < n leaves the last segments empty). In reduce-scatter step k
// (0 <= k < n-1) rank r sends segment (r-k-1) mod n to r+1 and reduces what
// r-1 sends into segment (r-k-2) mod n, so segment s is summed in the order
// s+1, s+2, ..., s and ends complete on rank s. Allgather step k: rank r sends
// segment (r-k) mod n and copies in segment (r-k-1) mod n.
//
// Pipelining. Every ring step is cut into C chunk steps, C = ceil(longest
// segment / max_chunk_elems), each segment split into C chunks as evenly as
// possible (so at most max_chunk_elems each, and empty when a segment is
// shorter than C). The send of step i reads exactly what step i - C received
// (or the input, for i < C). A transport that runs the steps in order, posts
// each step's send and recv together, and finishes step i before it starts
// step i + C is correct with C steps in flight: while chunk c goes on round
// the ring, chunk c+1 is on the wire behind it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace troupe::collectives {

/// Elements [offset_elems, offset_elems + len_elems) of a collective's buffer.
struct ElemRange {
  size_t offset_elems = 0;
  size_t len_elems = 0;

  bool operator==(const ElemRange&) const = default;
};

/// Segment `index` (< ranks) of a buffer of `count_elems` split over `ranks`
/// (the layout formula above): segment r is what rank r owns after a
/// reduce_scatter and contributes to an allgather.
ElemRange ring_segment(size_t count_elems, size_t ranks, size_t index);

/// What a ring step does with the elements it receives.
enum class RecvMode : uint8_t {
  reduce,  ///< reduce_into(local range, received): reduce-scatter steps.
  copy,    ///< overwrite the local range: allgather steps.
};

/// One (chunk) step of a ring: send `send` to the next rank, receive `recv`
/// from the previous one. The next rank's step at the same index receives
/// exactly `send`, so steps match up by index and a zero-length transfer can
/// be skipped by both ends without a message.
struct RingStep {
  ElemRange send;
  ElemRange recv;
  RecvMode recv_mode = RecvMode::copy;
};

/// One rank's part of a ring collective.
struct RingSchedule {
  /// (rank + 1) % ranks: every send goes there.
  size_t send_to = 0;
  /// (rank + ranks - 1) % ranks: every recv comes from there.
  size_t recv_from = 0;
  /// C: chunk steps per ring step; also how many steps may be in flight.
  size_t chunks_per_step = 0;
  /// In order; empty when ranks == 1 or count_elems == 0 (nothing moves).
  std::vector<RingStep> steps;
};

/// Allreduce: (n-1)*C reduce steps, then (n-1)*C copy steps; afterwards
/// every rank holds the reduction of all ranks' buffers (for avg, the sum:
/// the caller runs finish_avg).
/// REQUIRES: rank < ranks, max_chunk_elems >= 1 (aborts otherwise).
RingSchedule ring_allreduce_schedule(size_t ranks, size_t rank, size_t count_elems, size_t max_chunk_elems);

/// Reduce-scatter alone: the (n-1)*C reduce steps; afterwards rank r's
/// ring_segment(count, n, r) holds the reduction of that segment over all
/// ranks (the rest of its buffer holds partial sums).
/// REQUIRES: as ring_allreduce_schedule.
RingSchedule ring_reduce_scatter_schedule(size_t ranks, size_t rank, size_t count_elems, size_t max_chunk_elems);

/// Allgather alone: (n-1)*C copy steps; on input rank r's
/// ring_segment(count, n, r) holds its contribution (in place, in a buffer
/// of the full count), afterwards every rank holds every segment.
/// REQUIRES: as ring_allreduce_schedule.
RingSchedule ring_allgather_schedule(size_t ranks, size_t rank, size_t count_elems, size_t max_chunk_elems);

/// Direction of one message of a tree schedule.
enum class TreeOp : uint8_t { send, recv };

/// One message of a tree schedule: send the whole buffer to `peer`, or
/// receive it from `peer`.
struct TreeStep {
  size_t peer = 0;
  TreeOp op = TreeOp::send;

  bool operator==(const TreeStep&) const = default;
};

/// Broadcast from `root` down a binomial tree, in ranks relative to the
/// root (v = (rank - root) mod n): v receives from v minus its lowest set
/// bit, then sends to v + 2^j for each 2^j below that bit, largest first,
/// so the biggest subtree starts earliest. Each rank sends at most once per
/// round and all have the data after ceil(log2 n) rounds. Non-roots start
/// with their one recv; the root has only sends; peers are absolute ranks.
/// REQUIRES: root < ranks, rank < ranks.
std::vector<TreeStep> tree_broadcast_schedule(size_t ranks, size_t root, size_t rank);

/// Where one rank's chunks of a pipelined broadcast come from and go to:
/// every chunk from `parent` (none for the root), in order, and each one on
/// to every child, in order, as soon as it is here. Absolute ranks.
struct BroadcastTree {
  std::optional<size_t> parent;
  std::vector<size_t> children;

  bool operator==(const BroadcastTree&) const = default;
};

/// The shape a broadcast of `chunks` chunks over `ranks` ranks takes:
/// the binomial tree (tree_broadcast_schedule), or a chain root, root + 1,
/// ... (each rank forwards to the next). A sender's link carries each chunk
/// once per child, so the root of the binomial tree sends C * ceil(log2 n)
/// chunks and the last chunk is home about then; the chain's root sends C,
/// and its last chunk is home after C + n - 2 chunk times (the pipeline
/// filling). The chain goes for C (ceil(log2 n) - 1) > n - 2: a large buffer
/// over a few ranks (what NCCL's ring broadcast is), the tree for small
/// buffers (latency: ceil(log2 n) hops, not n - 1) and many ranks. For
/// n <= 2 both are the same edge.
/// REQUIRES: root < ranks, rank < ranks, chunks >= 1 (aborts otherwise).
BroadcastTree broadcast_tree(size_t ranks, size_t root, size_t rank, size_t chunks);

/// True when broadcast_tree chooses the chain for (ranks, chunks).
bool broadcast_uses_chain(size_t ranks, size_t chunks);

/// One round of a dissemination barrier: send a token to `send_to` and wait
/// for one from `recv_from`.
struct BarrierRound {
  size_t send_to = 0;
  size_t recv_from = 0;

  bool operator==(const BarrierRound&) const = default;
};

/// Dissemination barrier: ceil(log2 n) rounds, in round k send to
/// (rank + 2^k) mod n and receive from (rank - 2^k) mod n. After the last
/// round every rank has heard, through some chain, from every other, so
/// none leaves before all have arrived. Empty for one rank.
/// REQUIRES: rank < ranks.
std::vector<BarrierRound> barrier_schedule(size_t ranks, size_t rank);

}  // namespace troupe::collectives
