#include "collectives/host_arena.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "collectives/buffer_registry.h"
#include "collectives/host_id.h"
#include "collectives/reduce.h"
#include "collectives/ring.h"

namespace troupe::collectives {

namespace {

constexpr uint64_t kPageBytes = 4096;
/// All of an arena's slots together: 2 per rank. Enough for a 4-rank group
/// to move 4 MiB per rank and round (past which rounds got no faster in
/// the collectives benchmark), small enough to stay in a shared cache.
constexpr uint64_t kMaxSlotsBytes = uint64_t{32} << 20;
constexpr uint64_t kMagic = 0x74726f7570656172;  // "troupear"
/// Polls of another rank's counter before sleeping on it: a few
/// microseconds, worth it where ranks have cores of their own, and too
/// short to matter where they share them.
constexpr int kSpins = 256;
/// The longest single sleep: a wake lost to a concurrent abort() costs at
/// most this.
constexpr auto kSleepSlice = std::chrono::milliseconds(20);
/// Copies into a rank's buffer bypass the cache from this size of buffer
/// up: the buffer will not fit in cache anyway, and streaming stores save
/// reading each line before writing it.
constexpr size_t kStreamBytes = size_t{4} << 20;

/// A wait on a counter is done when it is at least `phase`, with counters
/// that wrap at 2^32 (a group may count more phases than that).
bool reached(uint32_t value, uint32_t phase) { return static_cast<int32_t>(value - phase) >= 0; }

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is in memory shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

/// Bytes an allreduce whose buffers are all in place folds at a time: the
/// n sources of a block are read once, the sum stays in L1 while it is
/// written to the n buffers. Measured with troupe_bench_arena on 2 cores:
/// 2 KiB gave 57-62% of memcpy (4 ranks) and 24-36% (8), against 51-58%
/// and 19-23% for 8 KiB; 1 KiB was no better.
constexpr size_t kDirectBlockBytes = size_t{2} << 10;

/// Every wait's error once some process broke the arena.
Unexpected arena_broken() {
  return error(ErrorCode::peer_lost, "collectives: the group's arena was broken (a rank failed or left)");
}

/// A futex wait's timeout: at most kSleepSlice of what is left.
timespec sleep_slice(std::chrono::nanoseconds left) {
  auto slice = std::min<std::chrono::nanoseconds>(left, kSleepSlice);
  return timespec{static_cast<time_t>(slice.count() / 1'000'000'000), static_cast<long>(slice.count() % 1'000'000'000)};
}

void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

/// memcpy whose destination is not read again soon: 16-byte streaming
/// stores on x86-64, memcpy elsewhere. Streaming stores are weakly ordered:
/// fence() (or a call with fence) before others may read what they wrote.
void copy_streaming(std::byte* dst, const std::byte* src, size_t bytes, bool fence = true) {
#if defined(__x86_64__)
  size_t head = (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16;
  if (bytes < head + 64) {
    std::memcpy(dst, src, bytes);
    return;
  }
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
  if (fence) store_fence();
#else
  (void)fence;
  std::memcpy(dst, src, bytes);
#endif
}

/// True when process `pid` can no longer touch memory: it does not exist,
/// or it has exited and awaits its parent's wait (a zombie: its mappings
/// are gone).
bool process_gone(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return false;
  char line[512] = {};
  size_t len = std::fread(line, 1, sizeof(line) - 1, f);
  std::fclose(f);
  // "pid (comm) S ...": the state follows the last ')' (comm may hold one).
  const char* close = nullptr;
  for (size_t i = 0; i < len; ++i) {
    if (line[i] == ')') close = line + i;
  }
  return close != nullptr && close + 2 < line + len && (close[2] == 'Z' || close[2] == 'X');
}

/// Piece `round` of segment `segment` of a buffer of `count` elements over
/// `ranks`, in pieces of at most `piece_elems`: an element range of the
/// buffer (empty past the segment's end).
ElemRange piece_of(size_t count, size_t ranks, size_t segment, size_t round, size_t piece_elems) {
  ElemRange s = ring_segment(count, ranks, segment);
  size_t begin = std::min(s.len_elems, round * piece_elems);
  size_t end = std::min(s.len_elems, begin + piece_elems);
  return ElemRange{s.offset_elems + begin, end - begin};
}

}  // namespace

/// Where a rank's buffer is, for the others to read it in place: its
/// CollectiveBuffer's segment and the buffer's offset in it. pid 0: not
/// registered (or too small to be worth it): read it from the rank's slot.
/// Plain words, written before the rank counts its first phase of a call
/// and read after that count.
struct HostArena::BufferAt {
  int64_t pid;
  int32_t fd;
  uint64_t cookie;
  uint64_t slot_bytes;
  uint64_t offset_bytes;
};

/// The first slot of the segment: a head, then one line per rank. Counters
/// are on lines of their own: each is written by one rank and polled by all
/// the others.
struct HostArena::Control {
  struct alignas(64) Head {
    uint64_t magic;
    uint64_t ranks;
    uint64_t slot_bytes;
    std::atomic<uint32_t> broken;
  };
  struct alignas(64) Rank {
    std::atomic<uint32_t> progress;  // phases counted; the futex word
    std::atomic<uint32_t> waiters;   // ranks sleeping on `progress`
    // 1 while the rank writes results into the others' buffers (an
    // allreduce with every buffer in place); a futex word once the arena
    // is broken, for ranks waiting to have their buffers back.
    std::atomic<uint32_t> writing;
    std::atomic<uint64_t> signature[2];  // by call parity: a rank is at most one call ahead of another
    BufferAt buffer[2];                  // by call parity, as the signature
  };
  Head head;

  Rank& rank(uint32_t r) { return std::launder(reinterpret_cast<Rank*>(reinterpret_cast<std::byte*>(this) + sizeof(Head)))[r]; }
  static uint64_t bytes_for(uint32_t ranks) { return sizeof(Head) + sizeof(Rank) * ranks; }
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the arena's counters are shared between processes: they must be plain words");

uint64_t HostArena::slot_bytes_for(uint32_t ranks, uint64_t chunk_bytes) {
  uint64_t bytes = std::min<uint64_t>(chunk_bytes, kMaxSlotsBytes / (2 * uint64_t{std::max(ranks, 1u)}));
  bytes = std::max<uint64_t>({bytes, kPageBytes * ranks, Control::bytes_for(ranks)});
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

Result<HostArena> HostArena::create(uint32_t ranks, uint64_t chunk_bytes) {
  if (ranks == 0 || ranks > 4096) {
    return error(ErrorCode::invalid_argument, "collectives: a host arena for " + std::to_string(ranks) + " ranks");
  }
  uint64_t slot_bytes = slot_bytes_for(ranks, chunk_bytes);
  auto segment = SlotSegment::create(2 * ranks + 1, slot_bytes);
  if (!segment) return error(segment.error());
  HostArena a;
  a.segment_ = std::move(*segment);
  a.ranks_ = ranks;
  a.position_bytes_ = slot_bytes / ranks / 64 * 64;
  std::byte* base = a.segment_.slot(0);
  new (base) Control::Head{kMagic, ranks, slot_bytes, {0}};
  auto* rank_words = reinterpret_cast<Control::Rank*>(base + sizeof(Control::Head));
  for (uint32_t r = 0; r < ranks; ++r) new (rank_words + r) Control::Rank{{0}, {0}, {0}, {{0}, {0}}, {}};
  return a;
}

Result<HostArena> HostArena::open(const SlotsOffer& offer, uint32_t ranks) {
  if (ranks == 0 || ranks > 4096 || offer.slots != 2 * ranks + 1) {
    return error(ErrorCode::malformed, "collectives: an arena offer of " + std::to_string(offer.slots) +
                                           " slots is not for " + std::to_string(ranks) + " ranks");
  }
  auto segment = SlotSegment::open(offer);
  if (!segment) return error(segment.error());
  HostArena a;
  a.segment_ = std::move(*segment);
  a.ranks_ = ranks;
  a.position_bytes_ = a.segment_.slot_bytes() / ranks / 64 * 64;
  if (auto ok = a.check_control(); !ok) return error(ok.error());
  return a;
}

Result<void> HostArena::check_control() {
  const Control::Head& h = control()->head;
  if (segment_.slot_bytes() < Control::bytes_for(ranks_) || h.magic != kMagic || h.ranks != ranks_ ||
      h.slot_bytes != segment_.slot_bytes() || position_bytes_ == 0) {
    return error(ErrorCode::unsupported, "collectives: the shared segment offered is not an arena for " +
                                             std::to_string(ranks_) + " ranks");
  }
  return {};
}

HostArena::Control* HostArena::control() const {
  return std::launder(reinterpret_cast<Control*>(segment_.slot(0)));
}

std::byte* HostArena::slot(uint64_t parity, uint32_t rank) const {
  return segment_.slot(static_cast<uint32_t>(1 + parity * ranks_ + rank));
}

void HostArena::abort() {
  if (!segment_) return;
  Control* c = control();
  c->head.broken.store(1, std::memory_order_seq_cst);
  for (uint32_t r = 0; r < ranks_; ++r) futex(&c->rank(r).progress, FUTEX_WAKE, INT_MAX, nullptr);
}

bool HostArena::broken() const { return segment_ && control()->head.broken.load(std::memory_order_acquire) != 0; }

bool HostArena::writing(uint32_t rank) const {
  return segment_ && control()->rank(rank).writing.load(std::memory_order_seq_cst) != 0;
}

void HostArena::count_phase(ArenaRank& me) {
  Control::Rank& w = control()->rank(me.rank);
  // seq_cst on both sides (here and in wait_for): a rank that found no
  // sleeper had counted before the sleeper looked at the counter, so the
  // sleeper saw the new count and never slept.
  me.phase = w.progress.fetch_add(1, std::memory_order_seq_cst) + 1;
  if (w.waiters.load(std::memory_order_seq_cst) != 0) futex(&w.progress, FUTEX_WAKE, INT_MAX, nullptr);
}

Result<void> HostArena::wait_for(uint32_t rank, uint32_t phase, std::chrono::steady_clock::time_point deadline) {
  Control* c = control();
  Control::Rank& w = c->rank(rank);
  for (int i = 0; i < kSpins; ++i) {
    if (reached(w.progress.load(std::memory_order_acquire), phase)) return {};
    cpu_relax();
  }
  for (;;) {
    if (c->head.broken.load(std::memory_order_acquire) != 0) return arena_broken();
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return error(ErrorCode::timeout, "collectives: rank " + std::to_string(rank) + " did not get there in time");
    }
    timespec ts = sleep_slice(deadline - now);
    w.waiters.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = w.progress.load(std::memory_order_seq_cst);
    if (!reached(seen, phase)) futex(&w.progress, FUTEX_WAIT, seen, &ts);
    w.waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(w.progress.load(std::memory_order_acquire), phase)) return {};
  }
}

Result<void> HostArena::wait_all(const ArenaRank& me, std::chrono::steady_clock::time_point deadline) {
  // Starting after this rank: rank r - 1's counter is the likeliest to be
  // behind (if all came in rank order), so it is waited on last.
  for (uint32_t k = 1; k < ranks_; ++k) {
    if (auto ok = wait_for((me.rank + k) % ranks_, me.phase, deadline); !ok) return ok;
  }
  return {};
}

Result<std::byte*> HostArena::peer_data(ArenaRank& me, uint32_t q, const BufferAt& at, size_t bytes) {
  auto bad = [&](const std::string& why) {
    return error(ErrorCode::unsupported, "collectives: rank " + std::to_string(me.rank) + " cannot read rank " +
                                             std::to_string(q) + "'s CollectiveBuffer in place: " + why);
  };
  if (at.offset_bytes > at.slot_bytes || bytes > at.slot_bytes - at.offset_bytes) {
    return bad("it says its " + std::to_string(bytes) + " bytes are at " + std::to_string(at.offset_bytes) +
               " of a " + std::to_string(at.slot_bytes) + "-byte buffer");
  }
  if (at.pid == static_cast<int64_t>(::getpid())) {  // a rank of this process: no second mapping
    std::byte* base = registered_base(at.cookie);
    if (base == nullptr) return bad("it was freed during the collective");
    return base + at.offset_bytes;
  }
  auto& kept = me.peer_buffers;
  auto it = std::find_if(kept.begin(), kept.end(), [&](const PeerBuffer& b) { return b.rank == q && b.cookie == at.cookie; });
  if (it == kept.end()) {
    // Read-write: an allreduce with every buffer in place writes its results
    // straight into the others' buffers.
    auto segment = SlotSegment::open(SlotsOffer{at.pid, at.fd, at.cookie, 1, at.slot_bytes, host_id()});
    if (!segment) {
      if (process_gone(at.pid)) {
        return error(ErrorCode::peer_lost, "collectives: rank " + std::to_string(q) + "'s process (pid " +
                                               std::to_string(at.pid) + ") is gone");
      }
      return bad(segment.error().message());
    }
    auto of_q = [&](const PeerBuffer& b) { return b.rank == q; };
    // A new buffer of q: the ones it has freed since (its collectives that
    // read them are over) are unmapped, so that their memory goes now
    // rather than when newer ones push them out.
    std::erase_if(kept, [&](const PeerBuffer& b) { return of_q(b) && !b.segment.still_offered(); });
    if (static_cast<size_t>(std::count_if(kept.begin(), kept.end(), of_q)) >= kPeerBuffersKept) {
      kept.erase(std::find_if(kept.begin(), kept.end(), of_q));  // its least recently used
    }
    kept.push_back(PeerBuffer{q, at.cookie, std::move(*segment)});
  } else if (it + 1 != kept.end()) {  // most recently used last
    std::rotate(it, it + 1, kept.end());
  }
  return kept.back().segment.slot(0) + at.offset_bytes;
}

Result<void> HostArena::write_directly(const ArenaRank& me, const ArenaCall& call,
                                      const std::vector<std::byte*>& data, bool stream) {
  Control* c = control();
  Control::Rank& w = c->rank(me.rank);
  const uint32_t n = ranks_;
  const size_t width = dtype_size(call.dtype);
  const size_t block = kDirectBlockBytes / width;
  alignas(64) std::byte sum[kDirectBlockBytes];
  std::vector<const std::byte*> srcs(n);
  // seq_cst, as abort()'s store of the broken flag and settle_writers'
  // loads: either this rank sees the arena broken before its first write,
  // or the rank that broke it sees this flag and waits for it to clear.
  w.writing.store(1, std::memory_order_seq_cst);
  bool stopped = false;
  auto write_run = [&](const ElemRange& run) {
    for (size_t i = 0; i < run.len_elems && !stopped; i += block) {
      if (c->head.broken.load(std::memory_order_seq_cst) != 0) {
        stopped = true;
        return;
      }
      const size_t offset = (run.offset_elems + i) * width, len = std::min(block, run.len_elems - i);
      for (uint32_t q = 0; q < n; ++q) srcs[q] = data[q] + offset;
      reduce_many(call.dtype, call.op, sum, srcs.data(), n, len);
      if (call.op == ReduceOp::avg) finish_avg(call.dtype, sum, len, n);
      for (uint32_t k = 0; k < n; ++k) {
        std::byte* dst = data[(me.rank + k) % n] + offset;
        stream ? copy_streaming(dst, sum, len * width, /*fence=*/false) : (void)std::memcpy(dst, sum, len * width);
      }
    }
  };
  if (call.segments.empty()) {
    write_run(ring_segment(call.count_elems, n, me.rank));
  } else {
    for (const ElemRange& run : call.segments[me.rank]) write_run(run);
  }
  if (stream) store_fence();
  w.writing.store(0, std::memory_order_seq_cst);
  if (c->head.broken.load(std::memory_order_seq_cst) != 0) {
    futex(&w.writing, FUTEX_WAKE, INT_MAX, nullptr);  // ranks in settle_writers
    stopped = true;
  }
  if (stopped) return arena_broken();
  return {};
}

Result<void> HostArena::settle_writers(const ArenaRank& me) {
  Control* c = control();
  const uint64_t parity = me.calls % 2;  // the failed call's: calls counts those done
  const auto until = std::chrono::steady_clock::now() + kWriterGrace;
  for (uint32_t q = 0; q < ranks_; ++q) {
    if (q == me.rank) continue;
    Control::Rank& w = c->rank(q);
    for (;;) {
      if (w.writing.load(std::memory_order_seq_cst) == 0) break;
      const int64_t pid = w.buffer[parity].pid;  // a writer published its buffer
      if (pid != static_cast<int64_t>(::getpid()) && process_gone(pid)) break;
      auto now = std::chrono::steady_clock::now();
      if (now >= until) {
        return error(ErrorCode::timeout,
                     "rank " + std::to_string(q) + " (pid " + std::to_string(pid) + ") was still writing into rank " +
                         std::to_string(me.rank) + "'s CollectiveBuffer " +
                         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kWriterGrace).count()) +
                         " s after the collective failed (is that process stopped?): the buffer may change until it "
                         "goes on or is killed");
      }
      timespec ts = sleep_slice(until - now);
      futex(&w.writing, FUTEX_WAIT, 1, &ts);
    }
  }
  return {};
}

Result<void> HostArena::run(ArenaRank& me, const ArenaCall& call, std::chrono::steady_clock::time_point deadline) {
  bool exposed = false;
  auto done = run_call(me, call, deadline, exposed);
  if (done || !exposed) return done;
  // The others may be writing into this rank's buffer (an allreduce with
  // every buffer in place): the arena is broken so that they stop, and the
  // buffer is the caller's again only once they have.
  abort();
  if (auto settled = settle_writers(me); !settled) {
    return error(done.error().code(), done.error().message() + "; " + settled.error().message());
  }
  return done;
}

Result<void> HostArena::run_call(ArenaRank& me, const ArenaCall& call, std::chrono::steady_clock::time_point deadline,
                                 bool& exposed) {
  if (broken()) {
    return arena_broken();
  }
  const uint32_t n = ranks_, r = me.rank;
  const size_t width = dtype_size(call.dtype);
  const size_t piece = position_bytes_ / width;  // elements per position
  const bool reduces = call.kind == CollectiveKind::allreduce || call.kind == CollectiveKind::reduce_scatter;
  const bool laid_out = !call.segments.empty();
  if (laid_out && call.segments.size() != n) {
    return error(ErrorCode::invalid_argument, "collectives: an arena call with " + std::to_string(call.segments.size()) +
                                                  " segments for " + std::to_string(n) + " ranks");
  }
  size_t longest = ring_segment(call.count_elems, n, 0).len_elems;
  if (laid_out) {
    longest = 0;
    for (const auto& runs : call.segments) {
      size_t len = 0;
      for (const ElemRange& run : runs) len += run.len_elems;
      longest = std::max(longest, len);
    }
  }
  size_t rounds = 1;
  if (call.kind == CollectiveKind::broadcast) {
    rounds = std::max<size_t>(1, (call.count_elems + piece * n - 1) / (piece * n));
  } else if (call.kind != CollectiveKind::barrier) {
    rounds = std::max<size_t>(1, (longest + piece - 1) / piece);
  }
  const size_t bytes = call.count_elems * width;
  const bool stream = bytes >= kStreamBytes;
  auto into_buffer = [&](std::byte* dst, const std::byte* src, size_t len) {
    stream ? copy_streaming(dst, src, len) : (void)std::memcpy(dst, src, len);
  };
  auto at = [&](const ElemRange& e) { return call.data + e.offset_elems * width; };
  // Piece `t` of segment `q`: fn(its offset in the piece, in elements; the
  // buffer's elements) for each run it covers (one in the default layout).
  auto for_piece = [&](uint32_t q, size_t t, auto&& fn) {
    if (!laid_out) {
      ElemRange p = piece_of(call.count_elems, n, q, t, piece);
      if (p.len_elems > 0) fn(size_t{0}, p);
      return;
    }
    const size_t begin = t * piece, end = begin + piece;
    size_t seen = 0;
    for (const ElemRange& run : call.segments[q]) {
      size_t lo = std::max(begin, seen), hi = std::min(end, seen + run.len_elems);
      if (lo < hi) fn(lo - begin, ElemRange{run.offset_elems + (lo - seen), hi - lo});
      seen += run.len_elems;
      if (seen >= end) break;
    }
  };
  Control* c = control();
  const uint64_t parity = me.calls % 2;
  // Published with the signature: where this rank's buffer is, when the
  // others can read it in place.
  BufferAt published{0, -1, 0, 0, 0};
  if (call.kind != CollectiveKind::barrier && bytes >= kInPlaceMinBytes) {
    if (auto span = find_registered(call.data, bytes)) {
      published = BufferAt{span->offer.pid, span->offer.fd, span->offer.cookie, span->offer.slot_bytes, span->offset_bytes};
    }
  }
  const bool in_place = published.pid != 0;
  c->rank(r).buffer[parity] = published;
  c->rank(r).signature[parity].store(call.signature, std::memory_order_relaxed);
  std::vector<const std::byte*> srcs(n);
  // Each rank's buffer as this process sees it, where it is read in place;
  // nullptr where it goes through the rank's slot. Known after round 0's A.
  std::vector<std::byte*> direct(n, nullptr);
  bool any_direct = false;

  for (size_t t = 0; t < rounds; ++t) {
    const uint64_t slot_parity = (me.rounds + t) % 2;
    std::byte* mine = slot(slot_parity, r);
    // Where rank q's piece at `in_piece` of its position `pos` is: in its
    // buffer (element range p) or in its slot.
    auto from = [&](uint32_t q, uint32_t pos, size_t in_piece, const ElemRange& p) {
      return direct[q] != nullptr ? direct[q] + p.offset_elems * width
                                  : slot(slot_parity, q) + pos * position_bytes_ + in_piece * width;
    };
    // A: this rank's data into its slot; nothing to copy when the others
    // read it in place.
    if (in_place) {
      // (its buffer is where they look)
    } else if (reduces) {
      for (uint32_t q = 0; q < n; ++q) {
        for_piece(q, t, [&](size_t in_piece, ElemRange p) {
          std::memcpy(mine + q * position_bytes_ + in_piece * width, at(p), p.len_elems * width);
        });
      }
    } else if (call.kind == CollectiveKind::allgather) {
      for_piece(r, t, [&](size_t in_piece, ElemRange p) {
        std::memcpy(mine + r * position_bytes_ + in_piece * width, at(p), p.len_elems * width);
      });
    } else if (call.kind == CollectiveKind::broadcast && r == call.root) {
      size_t begin = std::min(call.count_elems, t * piece * n);
      size_t len = std::min(call.count_elems - begin, piece * n);
      std::memcpy(mine, call.data + begin * width, len * width);
    }
    count_phase(me);
    // From here the others may write into this rank's buffer, until they
    // count the closing phase.
    if (t == 0) exposed = in_place && call.kind == CollectiveKind::allreduce;
    if (auto ok = wait_all(me, deadline); !ok) return ok;
    if (t == 0) {
      for (uint32_t q = 0; q < n; ++q) {
        if (c->rank(q).signature[parity].load(std::memory_order_relaxed) == call.signature) continue;
        return error(ErrorCode::invalid_argument,
                     "collectives: the ranks of the group disagree: rank " + std::to_string(q) +
                         " is in another collective than rank " + std::to_string(r) + "'s " + call.what +
                         "; every rank must call the same collectives (kind, count, type, op, root) in the same order");
      }
      for (uint32_t q = 0; q < n; ++q) {
        const BufferAt theirs = c->rank(q).buffer[parity];
        if (theirs.pid == 0) continue;
        any_direct = true;
        if (q == r) {
          direct[q] = call.data;
          continue;
        }
        // A failure here fails this rank's collective; its engine breaks
        // the group with the reason, which releases the others at once.
        auto data = peer_data(me, q, theirs, bytes);
        if (!data) return error(data.error());
        direct[q] = *data;
      }
      if (call.kind == CollectiveKind::allreduce &&
          std::none_of(direct.begin(), direct.end(), [](const std::byte* d) { return d == nullptr; })) {
        if (auto ok = write_directly(me, call, direct, stream); !ok) return ok;
        ++me.direct_calls;
        rounds = 1;  // the others, too, stop after round 0
        break;
      }
    }
    // B: this rank's position of every rank's data, folded in rank order:
    // into its own slot (allreduce, for the others to copy) or its buffer.
    if (reduces) {
      for_piece(r, t, [&](size_t in_piece, ElemRange p) {
        for (uint32_t q = 0; q < n; ++q) srcs[q] = from(q, r, in_piece, p);
        std::byte* dst = call.kind == CollectiveKind::allreduce && !in_place
                             ? mine + r * position_bytes_ + in_piece * width
                             : at(p);
        reduce_many(call.dtype, call.op, dst, srcs.data(), n, p.len_elems);
        if (call.op == ReduceOp::avg) finish_avg(call.dtype, dst, p.len_elems, n);
      });
      if (call.kind == CollectiveKind::allreduce) count_phase(me);
    }
    // C: the others' results (or contributions) into this rank's buffer.
    if (call.kind == CollectiveKind::allreduce || call.kind == CollectiveKind::allgather) {
      for (uint32_t k = 0; k < n; ++k) {
        uint32_t q = (r + k) % n;  // its own first: ready without a wait
        if (q == r && (call.kind == CollectiveKind::allgather || in_place)) continue;
        if (q != r && call.kind == CollectiveKind::allreduce) {
          if (auto ok = wait_for(q, me.phase, deadline); !ok) return ok;
        }
        for_piece(q, t, [&](size_t in_piece, ElemRange p) {
          into_buffer(at(p), from(q, q, in_piece, p), p.len_elems * width);
        });
      }
    } else if (call.kind == CollectiveKind::broadcast && r != call.root) {
      size_t begin = std::min(call.count_elems, t * piece * n);
      size_t len = std::min(call.count_elems - begin, piece * n);
      const std::byte* src = direct[call.root] != nullptr ? direct[call.root] + begin * width : slot(slot_parity, call.root);
      into_buffer(call.data + begin * width, src, len * width);
    }
  }
  // The closing phase: a buffer others read in place is its caller's again
  // only once they are done with it.
  if (any_direct) {
    ++me.in_place_calls;
    count_phase(me);
    if (in_place) {
      if (auto ok = wait_all(me, deadline); !ok) return ok;
    }
  }
  me.rounds += rounds;
  ++me.calls;
  return {};
}

}  // namespace troupe::collectives
