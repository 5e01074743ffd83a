// Receive buffers for large frames, reused. A fresh buffer of a few MiB
// costs a page fault and a kernel page clearing per page on its first
// write, as much as receiving into it (21% of the receiver's time in a
// 16 MiB UCX profile); a buffer that comes back from the last reader of
// its frame has its pages already. Both transports take their large
// receive buffers here, and whoever drops a frame's payload (the node,
// once its decode and every Bytes slice of it are done) gives it back.
//
// Bounded: it keeps at most kMaxBuffers buffers and max_bytes() bytes of
// them in all (TROUPE_RECEIVE_POOL_MIB, default 256; 0 turns it off), and
// a buffer is reused only for a frame at least half its size, so a small
// frame never pins a huge one. Thread-safe: transports take on their
// progress threads, readers give back on theirs.
#pragma once

#include <cstddef>
#include <string>

namespace troupe::detail {

/// Frames below this are received into fresh buffers (malloc reuses their
/// memory already) and never pooled.
inline constexpr size_t kPooledMinBytes = size_t{256} << 10;

/// What ReceivePool did, for tests and benchmarks.
struct ReceivePoolStats {
  size_t reused = 0;       // takes served by a kept buffer
  size_t fresh = 0;        // takes of kPooledMinBytes or more that allocated
  size_t kept = 0;         // buffers kept now
  size_t kept_bytes = 0;   // their capacity in all
};

/// Takes a buffer of `n` bytes (its contents unspecified, for the caller to
/// write over whole): a kept one when one fits, else a fresh one (with
/// huge pages advised for large ones: uninitialized.h).
std::string take_receive_buffer(size_t n);

/// Gives a payload's buffer back for later frames: kept when it is large
/// enough and the pool has room, freed otherwise.
void give_receive_buffer(std::string&& buffer);

/// The pool's counters (process-wide).
ReceivePoolStats receive_pool_stats();

/// Frees every kept buffer (tests; and a process that wants its memory
/// back after a burst of large messages).
void drain_receive_pool();

}  // namespace troupe::detail
