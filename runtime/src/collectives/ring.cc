#include "collectives/ring.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace troupe::collectives {
namespace {

// The callers are the mesh layer and the transport, which validate user
// input first: a bad argument here is a bug in troupe, so it aborts.
[[noreturn]] void contract_broken(const char* where, const char* what, size_t ranks, size_t got) {
  std::fprintf(stderr, "troupe: collectives %s: %s (ranks=%zu, got %zu)\n", where, what, ranks, got);
  std::abort();
}

void check_ring_args(const char* where, size_t ranks, size_t rank, size_t max_chunk_elems) {
  if (rank >= ranks) contract_broken(where, "rank out of range", ranks, rank);
  if (max_chunk_elems == 0) contract_broken(where, "max_chunk_elems is 0", ranks, rank);
}

// (a - b) mod n for a, b < n, without going negative.
size_t sub_mod(size_t a, size_t b, size_t n) { return (a + n - b % n) % n; }

// Chunk `index` of C chunks of `range`, split as evenly as possible (the
// same rule as segments).
ElemRange chunk_of(ElemRange range, size_t chunks, size_t index) {
  size_t base = range.len_elems / chunks;
  size_t extra = range.len_elems % chunks;
  return {range.offset_elems + index * base + std::min(index, extra), base + (index < extra ? 1 : 0)};
}

// The ring's fixed parts: peers and C.
RingSchedule ring_frame(size_t ranks, size_t rank, size_t count_elems, size_t max_chunk_elems) {
  RingSchedule s;
  s.send_to = (rank + 1) % ranks;
  s.recv_from = sub_mod(rank, 1, ranks);
  size_t longest_elems = ring_segment(count_elems, ranks, 0).len_elems;
  s.chunks_per_step = (longest_elems + max_chunk_elems - 1) / max_chunk_elems;
  return s;
}

// Appends n-1 ring steps, each cut into C chunk steps: in step k send
// segment (rank - k - send_shift) and receive segment (rank - k - send_shift - 1).
// Reduce-scatter uses shift 1 (so rank r ends owning segment r), allgather
// shift 0 (rank r starts by sending segment r).
void append_phase(RingSchedule& s, size_t ranks, size_t rank, size_t count_elems, size_t send_shift, RecvMode mode) {
  if (ranks == 1 || count_elems == 0) return;
  size_t chunks = s.chunks_per_step;
  for (size_t k = 0; k + 1 < ranks; ++k) {
    size_t send_seg = sub_mod(rank, k + send_shift, ranks);
    size_t recv_seg = sub_mod(rank, k + send_shift + 1, ranks);
    ElemRange send = ring_segment(count_elems, ranks, send_seg);
    ElemRange recv = ring_segment(count_elems, ranks, recv_seg);
    for (size_t c = 0; c < chunks; ++c) {
      s.steps.push_back({chunk_of(send, chunks, c), chunk_of(recv, chunks, c), mode});
    }
  }
}

}  // namespace

ElemRange ring_segment(size_t count_elems, size_t ranks, size_t index) {
  if (index >= ranks) contract_broken("ring_segment", "segment index out of range", ranks, index);
  size_t base = count_elems / ranks;
  size_t extra = count_elems % ranks;
  return {index * base + std::min(index, extra), base + (index < extra ? 1 : 0)};
}

RingSchedule ring_allreduce_schedule(size_t ranks, size_t rank, size_t count_elems, size_t max_chunk_elems) {
  check_ring_args("ring_allreduce_schedule", ranks, rank, max_chunk_elems);
  RingSchedule s = ring_frame(ranks, rank, count_elems, max_chunk_elems);
  if (ranks > 1) s.steps.reserve(2 * (ranks - 1) * s.chunks_per_step);
  append_phase(s, ranks, rank, count_elems, 1, RecvMode::reduce);
  append_phase(s, ranks, rank, count_elems, 0, RecvMode::copy);
  return s;
}

RingSchedule ring_reduce_scatter_schedule(size_t ranks, size_t rank, size_t count_elems, size_t max_chunk_elems) {
  check_ring_args("ring_reduce_scatter_schedule", ranks, rank, max_chunk_elems);
  RingSchedule s = ring_frame(ranks, rank, count_elems, max_chunk_elems);
  if (ranks > 1) s.steps.reserve((ranks - 1) * s.chunks_per_step);
  append_phase(s, ranks, rank, count_elems, 1, RecvMode::reduce);
  return s;
}

RingSchedule ring_allgather_schedule(size_t ranks, size_t rank, size_t count_elems, size_t max_chunk_elems) {
  check_ring_args("ring_allgather_schedule", ranks, rank, max_chunk_elems);
  RingSchedule s = ring_frame(ranks, rank, count_elems, max_chunk_elems);
  if (ranks > 1) s.steps.reserve((ranks - 1) * s.chunks_per_step);
  append_phase(s, ranks, rank, count_elems, 0, RecvMode::copy);
  return s;
}

std::vector<TreeStep> tree_broadcast_schedule(size_t ranks, size_t root, size_t rank) {
  if (root >= ranks) contract_broken("tree_broadcast_schedule", "root out of range", ranks, root);
  if (rank >= ranks) contract_broken("tree_broadcast_schedule", "rank out of range", ranks, rank);
  std::vector<TreeStep> steps;
  size_t v = sub_mod(rank, root, ranks);
  auto absolute = [&](size_t relative) { return (relative + root) % ranks; };
  // The parent is v without its lowest set bit; the root (v = 0) has none
  // and owns every bit below the first power of two >= ranks.
  size_t mask = 1;
  while (mask < ranks) {
    if (v & mask) {
      steps.push_back({absolute(v - mask), TreeOp::recv});
      break;
    }
    mask <<= 1;
  }
  // Children: v + 2^j for the bits below, largest subtree first.
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < ranks) steps.push_back({absolute(v + mask), TreeOp::send});
  }
  return steps;
}

bool broadcast_uses_chain(size_t ranks, size_t chunks) {
  size_t depth = 0;
  while ((size_t{1} << depth) < ranks) ++depth;
  return ranks > 2 && chunks * (depth - 1) > ranks - 2;
}

BroadcastTree broadcast_tree(size_t ranks, size_t root, size_t rank, size_t chunks) {
  if (chunks == 0) contract_broken("broadcast_tree", "chunks is 0", ranks, chunks);
  BroadcastTree t;
  if (broadcast_uses_chain(ranks, chunks)) {
    if (root >= ranks) contract_broken("broadcast_tree", "root out of range", ranks, root);
    if (rank >= ranks) contract_broken("broadcast_tree", "rank out of range", ranks, rank);
    size_t v = sub_mod(rank, root, ranks);
    if (v > 0) t.parent = sub_mod(rank, 1, ranks);
    if (v + 1 < ranks) t.children.push_back((rank + 1) % ranks);
    return t;
  }
  for (const TreeStep& s : tree_broadcast_schedule(ranks, root, rank)) {
    if (s.op == TreeOp::recv) {
      t.parent = s.peer;
    } else {
      t.children.push_back(s.peer);
    }
  }
  return t;
}

std::vector<BarrierRound> barrier_schedule(size_t ranks, size_t rank) {
  if (rank >= ranks) contract_broken("barrier_schedule", "rank out of range", ranks, rank);
  std::vector<BarrierRound> rounds;
  for (size_t distance = 1; distance < ranks; distance <<= 1) {
    rounds.push_back({(rank + distance) % ranks, sub_mod(rank, distance, ranks)});
  }
  return rounds;
}

}  // namespace troupe::collectives
