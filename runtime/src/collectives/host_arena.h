// The arena of a collective group whose ranks all run on one host: one
// shared-memory segment that every rank maps, through which allreduce,
// reduce_scatter, allgather, broadcast and barrier run without a ring (what
// the intra-node shared-memory paths of MPI, NCCL and DeepSpeed's CPU
// allreduce do).
//
// Each rank has two slots of `slot_bytes` (rounds alternate between them)
// and a progress counter in the segment's control block. A collective runs
// in rounds; each slot holds one position per rank, and round t moves piece
// t of every rank's segment (ring.h's layout, so the results are where the
// ring puts them). In round t of an allreduce rank r
//   A. copies piece t of every segment of its buffer into its slot, segment
//      q at position q, and counts a phase;
//   B. once every rank has counted A, folds position r of every rank's slot,
//      in rank order 0, 1, ..., n-1, into position r of its own slot, and
//      counts a phase;
//   C. copies position q of rank q's slot into its buffer, for every q, each
//      once rank q has counted B.
// A rank's buffer is read once and written once per collective; the other
// traffic is in slots small enough to stay in cache. The ring, by contrast,
// copies each segment 2(n-1) times through memory and reduces it n-1 times.
// reduce_scatter is A and B (B writes the buffer); allgather is A (a rank's
// own segment only) and C; broadcast is the root's A (the whole buffer, in
// pieces) and everyone else's C; barrier is one empty A.
//
// In place: a rank whose buffer lies in a CollectiveBuffer (shared memory,
// troupe/collective_buffer.h) publishes where it is with its signature, and
// the others map it (once: each rank keeps a few of every peer's buffers
// mapped) and read its data there instead of from its slot. Such a rank
// skips A's copies, folds its own positions in B straight into its buffer,
// and takes nothing back from its slot in C; ranks with ordinary buffers go
// through their slots as before, beside it. The phases are the same, so
// are the results, bit for bit: only where each piece is read from changes.
// One more phase at the end, counted by all when any rank's buffer is read
// in place: a rank whose buffer others read returns only once all have
// counted it (its caller may then write the buffer again).
//
// Written in place: an allreduce in which every rank's buffer is in place
// needs no slots at all. After A (which only publishes), rank r folds its
// segment of every buffer a small block at a time, in rank order, and
// writes the block's result into every rank's buffer, then counts the
// closing phase; no B or C. Each rank's segment is read and written by that
// rank alone, so the ranks never wait for each other in between, and each
// buffer is read once and written once in all (through the slots or read
// in place, a rank's results are also written once more and read back by
// the others): the least memory traffic an allreduce can have. A rank
// whose collective fails with its buffer open to the others' writes breaks
// the arena (they check between blocks) and returns only once none of them
// is writing, or its process is gone, or kWriterGrace has passed (then it
// says so): its caller gets its buffer back with nobody writing into it.
//
// Reuse without a phase for it: a rank writes a slot again two rounds
// later, after every rank has counted the A of the round in between, which
// each counts only after its B and C of the round before, which are all the
// reads of that slot. The same holds across collectives (rounds are counted
// over the group's life), so a rank returns as soon as its own C is done.
//
// Waiting: a rank waits for another's counter by spinning briefly, then
// sleeping on it as a futex (shared, so across processes), woken by the rank
// that counts. Every wait checks the arena's broken flag and the deadline:
// a rank whose process dies leaves the others waiting only until a process
// that notices breaks the arena (abort()), or until the deadline.
//
// Agreement: each rank writes its call's signature (kind, count, type, op,
// root) before counting its first A and compares everyone's after waiting
// for it, so ranks that call different collectives all fail with
// invalid_argument instead of reading each other's garbage.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/ring.h"
#include "collectives/shm_slots.h"
#include "troupe/collective_group.h"
#include "troupe/collectives.h"
#include "troupe/status.h"

namespace troupe::collectives {

/// One collective as a rank runs it on the arena.
struct ArenaCall {
  CollectiveKind kind = CollectiveKind::allreduce;
  std::byte* data = nullptr;  ///< count_elems elements of dtype, in place
  size_t count_elems = 0;
  DType dtype = DType::float32;
  ReduceOp op = ReduceOp::sum;
  uint32_t root = 0;       ///< broadcast
  uint64_t signature = 0;  ///< equal on every rank for the same collective
  std::string what;        ///< "allreduce of 1000 float32 (sum)", for errors
  /// Each rank's segment (reduce_scatter's result, allgather's share) as
  /// runs of the buffer, in order; empty: ring_segment's layout of the
  /// whole buffer. Every rank passes the same. Pieces of a segment move
  /// through the slots as of one range (a piece may span runs).
  std::vector<std::vector<ElemRange>> segments;
};

/// How a collective's data moved through the arena, from the slowest way to
/// the fastest.
enum class ArenaPath : uint8_t {
  /// Through the slots only.
  slots,
  /// Some rank's CollectiveBuffer read where it is.
  read_in_place,
  /// Every rank's CollectiveBuffer read and written where it is (an
  /// allreduce).
  written_in_place,
};

/// A peer's CollectiveBuffer as a rank has it mapped.
struct PeerBuffer {
  uint32_t rank = 0;
  uint64_t cookie = 0;
  SlotSegment segment;
};

/// Where one rank is in the arena's sequence: its own counter, the rounds
/// and the collectives it has done, and the peers' buffers it has mapped.
/// One per rank, used by one thread at a time, starting from zero when the
/// arena is new.
struct ArenaRank {
  uint32_t rank = 0;
  uint32_t phase = 0;
  uint64_t rounds = 0;
  uint64_t calls = 0;
  /// Collectives in which this rank read some rank's buffer in place.
  uint64_t in_place_calls = 0;
  /// Of those, allreduces whose results this rank wrote straight into
  /// every rank's buffer (every buffer was in place).
  uint64_t direct_calls = 0;
  /// Least recently used first; at most kPeerBuffersKept per peer.
  std::vector<PeerBuffer> peer_buffers = {};
};

/// Buffers of one peer a rank keeps mapped: enough for a trainer's
/// gradients and parameters and a spare; an older one is unmapped (and
/// freed, if its owner has freed it) when a newer one comes.
inline constexpr size_t kPeerBuffersKept = 4;

/// Collectives of fewer bytes go through the slots even from a
/// CollectiveBuffer: in place they would cost the closing phase and save
/// a copy that is in cache anyway.
inline constexpr size_t kInPlaceMinBytes = size_t{64} << 10;

/// How long a rank whose collective failed waits for the others to stop
/// writing into its buffer (they check for a broken arena between blocks,
/// so a rank that runs stops within microseconds; this bounds one that is
/// stopped or starved).
inline constexpr std::chrono::seconds kWriterGrace{5};

/// The control block and slots of a host-local group, mapped in this
/// process. Move-only; unmapping leaves the memory to the other ranks'
/// mappings (it goes with the last).
class HostArena {
 public:
  HostArena() = default;

  /// Makes an arena for `ranks` ranks, with slots of about `chunk_bytes`
  /// (clamped: see slot_bytes_for). Pages are backed when first written.
  static Result<HostArena> create(uint32_t ranks, uint64_t chunk_bytes);
  /// Maps the arena another process of this host made (its offer()); fails
  /// when it is not reachable from here (another host, another pid
  /// namespace, no permission) or is not an arena for `ranks` ranks.
  static Result<HostArena> open(const SlotsOffer& offer, uint32_t ranks);

  /// The slot size an arena of `ranks` ranks uses for a requested chunk
  /// size: chunk_bytes, but at most 32 MiB of slots in all and at least a
  /// page per rank and room for the control block; page aligned.
  static uint64_t slot_bytes_for(uint32_t ranks, uint64_t chunk_bytes);

  /// What the other ranks' processes need to map it.
  const SlotsOffer& offer() const { return segment_.offer(); }
  uint32_t ranks() const { return ranks_; }
  /// True for a mapped arena.
  explicit operator bool() const { return static_cast<bool>(segment_); }

  /// Runs `call` as rank `me.rank` with the other ranks (which call the same
  /// collective on their own threads, in their own processes), blocking
  /// until this rank's part is done. Errors: invalid_argument when the ranks
  /// called different collectives (every rank sees it), timeout past
  /// `deadline`, peer_lost once the arena is broken (broken() is then true).
  /// REQUIRES: me.rank < ranks(); the same `me` for all of a rank's calls.
  Result<void> run(ArenaRank& me, const ArenaCall& call, std::chrono::steady_clock::time_point deadline);

  /// Breaks the arena for every rank in every process: their waits return
  /// peer_lost now, and every later run does. Any thread, any time.
  void abort();
  /// True once some process broke the arena.
  bool broken() const;
  /// True while rank `rank` writes an allreduce's results into the ranks'
  /// buffers (every buffer in place). REQUIRES: rank < ranks().
  bool writing(uint32_t rank) const;

 private:
  struct Control;
  Control* control() const;
  std::byte* slot(uint64_t parity, uint32_t rank) const;
  Result<void> check_control();
  /// Counts a phase of `me`'s and wakes ranks sleeping on it.
  void count_phase(ArenaRank& me);
  /// Waits until rank `rank` has counted `phase` phases.
  Result<void> wait_for(uint32_t rank, uint32_t phase, std::chrono::steady_clock::time_point deadline);
  Result<void> wait_all(const ArenaRank& me, std::chrono::steady_clock::time_point deadline);
  Result<void> run_call(ArenaRank& me, const ArenaCall& call, std::chrono::steady_clock::time_point deadline,
                        bool& exposed);
  /// An allreduce with every rank's buffer at `data` (as mapped here): this
  /// rank's segment folded a block at a time and written into all of them.
  /// Stops (peer_lost) when the arena breaks.
  Result<void> write_directly(const ArenaRank& me, const ArenaCall& call, const std::vector<std::byte*>& data,
                              bool stream);
  /// Waits, after a failed call, until no other rank writes into this
  /// rank's buffer (each has stopped, or its process is gone), for at most
  /// kWriterGrace.
  Result<void> settle_writers(const ArenaRank& me);
  struct BufferAt;
  /// Where rank `q`'s buffer (published as `at`, `bytes` of it) is in this
  /// process: mapped (or found, in this process) on first use.
  Result<std::byte*> peer_data(ArenaRank& me, uint32_t q, const BufferAt& at, size_t bytes);

  SlotSegment segment_;
  uint32_t ranks_ = 0;
  uint64_t position_bytes_ = 0;  // a slot's room per rank (64-byte multiple)
};

}  // namespace troupe::collectives
