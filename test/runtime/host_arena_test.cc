// The host arena (collectives/host_arena.h) with every rank on a thread of
// its own, each through its own mapping of the segment (as separate
// processes see it): results against a reference for every kind, type, op,
// size and rank count, slots reused across rounds and collectives, and the
// ways a collective ends early: ranks that disagree, a rank that never
// comes (abort, deadline), an offer that is not an arena.
//
// The reference folds the ranks' inputs in rank order with reduce_into (the
// same element functions and bfloat16 rounding, checked against double
// references in collectives_algo_test.cc), so results are compared bit for
// bit.
//
// Ranks whose buffers lie in CollectiveBuffers (read in place by the
// others) run beside ranks with ordinary buffers, on threads (found in this
// process's registry) and in forked processes (each maps the others'
// buffers).
#include <sched.h>
#include <signal.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/host_arena.h"
#include "collectives/reduce.h"
#include "collectives/ring.h"
#include "troupe/collective_buffer.h"

using namespace std::chrono_literals;
using troupe::CollectiveKind;
using troupe::DType;
using troupe::ErrorCode;
using troupe::ReduceOp;
using namespace troupe::collectives;

namespace {

struct Case {
  CollectiveKind kind;
  size_t count;
  DType dtype;
  ReduceOp op;
  uint32_t root = 0;
  /// ArenaCall::segments: each rank's segment as runs; empty: ring_segment's.
  std::vector<std::vector<ElemRange>> segments = {};
};

/// Rank `rank`'s segment of case `k`, as runs of the buffer.
std::vector<ElemRange> segment_runs(const Case& k, size_t ranks, size_t rank) {
  if (k.segments.empty()) return {ring_segment(k.count, ranks, rank)};
  return k.segments[rank];
}

uint64_t signature_of(const Case& k) {
  return (static_cast<uint64_t>(k.kind) << 56) ^ (static_cast<uint64_t>(k.dtype) << 48) ^
         (static_cast<uint64_t>(k.op) << 40) ^ (static_cast<uint64_t>(k.root) << 32) ^ k.count;
}

/// Rank r's input: random bytes that are valid elements (bfloat16 and
/// float32 from small values, so sums are exact neither always nor never).
std::vector<std::byte> input(const Case& k, uint32_t rank, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000 + rank);
  std::vector<std::byte> v(k.count * troupe::dtype_size(k.dtype));
  std::uniform_real_distribution<float> real(-100.0f, 100.0f);
  for (size_t i = 0; i < k.count; ++i) {
    std::byte* at = v.data() + i * troupe::dtype_size(k.dtype);
    switch (k.dtype) {
      case DType::float32: { float f = real(rng); std::memcpy(at, &f, 4); break; }
      case DType::bfloat16: { uint16_t b = float_to_bf16(real(rng)); std::memcpy(at, &b, 2); break; }
      case DType::int32: { auto x = static_cast<int32_t>(rng()); std::memcpy(at, &x, 4); break; }
      case DType::int64: { auto x = static_cast<int64_t>(rng()); std::memcpy(at, &x, 8); break; }
    }
  }
  return v;
}

/// Every rank's input to case `k` from `seed`, in rank order.
using Inputs = std::vector<std::vector<std::byte>>;
Inputs inputs_of(const Case& k, uint32_t n, uint64_t seed) {
  Inputs in;
  for (uint32_t q = 0; q < n; ++q) in.push_back(input(k, q, seed));
  return in;
}

/// What rank `rank` must hold after the collective; `valid[i]` false where
/// the result is unspecified (reduce_scatter outside the rank's segment).
std::vector<std::byte> expected(const Case& k, const std::vector<std::vector<std::byte>>& in, uint32_t rank,
                                std::vector<bool>& valid) {
  size_t n = in.size(), width = troupe::dtype_size(k.dtype);
  valid.assign(k.count, true);
  std::vector<std::byte> out(k.count * width);
  switch (k.kind) {
    case CollectiveKind::allreduce:
    case CollectiveKind::reduce_scatter: {
      out = in[0];
      for (size_t q = 1; q < n; ++q) reduce_into(k.dtype, k.op, out.data(), in[q].data(), k.count);
      if (k.op == ReduceOp::avg) finish_avg(k.dtype, out.data(), k.count, n);
      if (k.kind == CollectiveKind::reduce_scatter) {
        valid.assign(k.count, false);
        for (const ElemRange& run : segment_runs(k, n, rank)) {
          for (size_t i = 0; i < run.len_elems; ++i) valid[run.offset_elems + i] = true;
        }
      }
      break;
    }
    case CollectiveKind::allgather:
      for (size_t q = 0; q < n; ++q) {
        for (const ElemRange& s : segment_runs(k, n, q)) {
          std::memcpy(out.data() + s.offset_elems * width, in[q].data() + s.offset_elems * width, s.len_elems * width);
        }
      }
      break;
    case CollectiveKind::broadcast: out = in[k.root]; break;
    case CollectiveKind::barrier: out = in[rank]; break;
  }
  return out;
}

/// How the ranks' threads see the arena.
enum class Mapping {
  /// Each through a mapping of its own, as each rank's process would.
  per_rank,
  /// All through the one made: ranks of one process. Where ranks read each
  /// other's CollectiveBuffers at the addresses they have in this process,
  /// this lets ThreadSanitizer see the counters that order those reads (it
  /// knows memory by address, and cannot tell two mappings of a page are
  /// one).
  one,
};

struct Arenas {
  HostArena made;
  std::vector<HostArena> mapped;
  std::vector<ArenaRank> ranks;
  Mapping mapping = Mapping::per_rank;

  Arenas(uint32_t n, uint64_t chunk_bytes, Mapping how = Mapping::per_rank) : mapping(how) {
    made = HostArena::create(n, chunk_bytes).value();
    for (uint32_t r = 0; r < n; ++r) {
      mapped.push_back(HostArena::open(made.offer(), n).value());
      ranks.push_back(ArenaRank{r});
    }
  }
  /// The arena as rank r sees it.
  HostArena& of(uint32_t r) { return mapping == Mapping::one ? made : mapped[r]; }
};

/// Which ranks' buffers are CollectiveBuffers, and where in them the data
/// starts (elements past the buffer's first byte).
struct Placement {
  std::vector<bool> registered = {};
  size_t offset_elems = 0;
};

/// Runs case `k` as rank `r` on `arena`, every rank's input in `in`
/// (inputs_of): its buffer a CollectiveBuffer or ordinary memory per
/// `where`. The elements that differ from the reference, or the error.
troupe::Result<size_t> run_case(HostArena& arena, ArenaRank& me, const Case& k, const Inputs& in,
                                const Placement& where) {
  const uint32_t r = me.rank;
  size_t width = troupe::dtype_size(k.dtype);
  std::vector<std::byte> plain;
  troupe::CollectiveBuffer shared;
  std::byte* data = nullptr;
  if (r < where.registered.size() && where.registered[r]) {
    // Room before and after the data: a span inside a larger buffer.
    shared = troupe::CollectiveBuffer::allocate((where.offset_elems + k.count + 3) * width).value();
    data = shared.data() + where.offset_elems * width;
  } else {
    plain.resize(std::max<size_t>(1, k.count) * width);
    data = plain.data();
  }
  std::memcpy(data, in[r].data(), k.count * width);
  ArenaCall call{k.kind, data, k.count, k.dtype, k.op, k.root, signature_of(k), "a test collective", k.segments};
  auto done = arena.run(me, call, std::chrono::steady_clock::now() + 60s);
  if (!done) return troupe::error(done.error());
  std::vector<bool> valid;
  std::vector<std::byte> want = expected(k, in, r, valid);
  size_t wrong = 0;
  for (size_t i = 0; i < k.count; ++i) {
    wrong += valid[i] && std::memcmp(data + i * width, want.data() + i * width, width) != 0;
  }
  return wrong;
}

/// Runs `cases` in order on every rank, each rank on its own thread, and
/// counts the elements (over all ranks and cases) that differ from the
/// reference; `errors` gets the first error of each rank.
size_t run_all(Arenas& a, const std::vector<Case>& cases, uint64_t seed, std::vector<std::string>& errors,
               const Placement& where = {}) {
  uint32_t n = static_cast<uint32_t>(a.mapped.size());
  std::vector<size_t> wrong(n, 0);
  errors.assign(n, "");
  // Each case's inputs are made once, by the first rank to reach it, and
  // dropped when the last has taken them (not n times over: with 8 ranks
  // that was most of a run's time).
  std::vector<std::once_flag> made(cases.size());
  std::vector<std::shared_ptr<const Inputs>> shared(cases.size());
  std::vector<std::atomic<uint32_t>> taken(cases.size());
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (size_t c = 0; c < cases.size(); ++c) {
        std::call_once(made[c], [&] { shared[c] = std::make_shared<const Inputs>(inputs_of(cases[c], n, seed + c)); });
        const std::shared_ptr<const Inputs> in = shared[c];
        if (taken[c].fetch_add(1) + 1 == n) shared[c].reset();
        auto done = run_case(a.of(r), a.ranks[r], cases[c], *in, where);
        if (!done) {
          errors[r] = done.error().to_string();
          return;
        }
        wrong[r] += *done;
      }
    });
  }
  for (auto& t : threads) t.join();
  size_t total = 0;
  for (size_t w : wrong) total += w;
  return total;
}

/// Every kind, type and op at sizes past kInPlaceMinBytes for every type
/// (and one below it), on `n` ranks; `segments` as in Case.
std::vector<Case> in_place_cases(uint32_t n, const std::vector<std::vector<ElemRange>>& segments = {}) {
  std::vector<Case> cases;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::int64}) {
    for (size_t count : {size_t{1001}, size_t{40'001}, size_t{100'003}}) {
      if (!segments.empty() && count != 40'001) continue;
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        cases.push_back(Case{CollectiveKind::allreduce, count, dtype, op, 0, segments});
        cases.push_back(Case{CollectiveKind::reduce_scatter, count, dtype, op, 0, segments});
      }
      cases.push_back(Case{CollectiveKind::allgather, count, dtype, ReduceOp::sum, 0, segments});
      if (segments.empty()) cases.push_back(Case{CollectiveKind::broadcast, count, dtype, ReduceOp::sum, n - 1});
      cases.push_back(Case{CollectiveKind::barrier, 0, dtype, ReduceOp::sum});
    }
  }
  return cases;
}

}  // namespace

TEST_CASE("host arena: every kind, type and op matches the rank-order reference bit for bit, over many rounds",
          "[collectives][arena]") {
  const CollectiveKind kinds[] = {CollectiveKind::allreduce, CollectiveKind::reduce_scatter, CollectiveKind::allgather,
                                  CollectiveKind::broadcast, CollectiveKind::barrier};
  const DType dtypes[] = {DType::float32, DType::bfloat16, DType::int32, DType::int64};
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
  for (uint32_t n : {1u, 2u, 3u, 4u, 7u, 8u}) {
    // Slots of a page per rank: a 40,001-element buffer takes several
    // rounds, so both slots of every rank are reused within a collective.
    for (uint64_t chunk : {uint64_t{4096}, uint64_t{1} << 20}) {
      std::vector<Case> cases;
      for (CollectiveKind kind : kinds) {
        for (DType dtype : dtypes) {
          for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{1001}, size_t{40'001}}) {
            if (kind == CollectiveKind::allreduce || kind == CollectiveKind::reduce_scatter) {
              for (ReduceOp op : ops) cases.push_back(Case{kind, count, dtype, op});
            } else if (kind == CollectiveKind::broadcast) {
              cases.push_back(Case{kind, count, dtype, ReduceOp::sum, n - 1});
            } else {
              cases.push_back(Case{kind, kind == CollectiveKind::barrier ? 0 : count, dtype, ReduceOp::sum});
            }
          }
        }
      }
      INFO(n << " ranks, chunk " << chunk << ": " << cases.size() << " collectives in a row");
      Arenas a(n, chunk);
      std::vector<std::string> errors;
      CHECK(run_all(a, cases, n * 7 + chunk, errors) == 0);
      for (auto& e : errors) CHECK(e.empty());
    }
  }
}

TEST_CASE("host arena: a long random sequence of collectives on ranks running free stays correct",
          "[collectives][arena]") {
  // Ranks race ahead of each other by up to a collective; rounds alternate
  // slots across collectives of different kinds and lengths.
  std::mt19937 rng(42);
  std::vector<Case> cases;
  for (int i = 0; i < 300; ++i) {
    auto kind = static_cast<CollectiveKind>(rng() % 5);
    size_t count = kind == CollectiveKind::barrier ? 0 : rng() % 5000;
    cases.push_back(Case{kind, count, DType::float32, static_cast<ReduceOp>(rng() % 4), static_cast<uint32_t>(rng() % 4)});
  }
  Arenas a(4, 4096);
  std::vector<std::string> errors;
  CHECK(run_all(a, cases, 99, errors) == 0);
  for (auto& e : errors) CHECK(e.empty());
}

TEST_CASE("host arena: segments laid out as runs (a column of a group over several hosts) reduce and gather in place",
          "[collectives][arena]") {
  // 4 ranks; rank q's segment is ring segments q and q + 4 of the buffer
  // cut over 8 (a host's column share in a 4 + 4 group), or 3-element
  // blocks dealt round-robin (many runs, pieces spanning several).
  const size_t count = 40'001;
  std::vector<std::vector<ElemRange>> columns(4), dealt(4);
  for (uint32_t q = 0; q < 4; ++q) columns[q] = {ring_segment(count, 8, q), ring_segment(count, 8, q + 4)};
  for (size_t at = 0, block = 0; at < count; at += 3, ++block) {
    dealt[block % 4].push_back(ElemRange{at, std::min<size_t>(3, count - at)});
  }
  std::vector<Case> cases;
  for (const auto* segments : {&columns, &dealt}) {
    for (DType dtype : {DType::float32, DType::bfloat16, DType::int64}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        cases.push_back(Case{CollectiveKind::reduce_scatter, count, dtype, op, 0, *segments});
        cases.push_back(Case{CollectiveKind::allreduce, count, dtype, op, 0, *segments});
      }
      cases.push_back(Case{CollectiveKind::allgather, count, dtype, ReduceOp::sum, 0, *segments});
    }
  }
  for (uint64_t chunk : {uint64_t{4096}, uint64_t{1} << 20}) {
    INFO("chunk " << chunk);
    Arenas a(4, chunk);
    std::vector<std::string> errors;
    CHECK(run_all(a, cases, 5 + chunk, errors) == 0);
    for (auto& e : errors) CHECK(e.empty());
  }
  // A layout for another number of ranks is refused, on every rank alike.
  Arenas a(2, 4096);
  std::vector<float> x(10, 1.0f);
  ArenaCall call{CollectiveKind::allgather, reinterpret_cast<std::byte*>(x.data()), 10, DType::float32,
                 ReduceOp::sum, 0, 1, "allgather", columns};
  auto refused = a.mapped[0].run(a.ranks[0], call, std::chrono::steady_clock::now() + 60s);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code() == ErrorCode::invalid_argument);
}

TEST_CASE("host arena: ranks that call different collectives all fail with a clear error", "[collectives][arena]") {
  Arenas a(4, 1 << 20);
  std::vector<troupe::Result<void>> results(4, troupe::Result<void>{});
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> bufs(4, std::vector<float>(1000, 1.0f));
  for (uint32_t r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      // Rank 2 asks for 999 elements.
      Case k{CollectiveKind::allreduce, r == 2 ? size_t{999} : size_t{1000}, DType::float32, ReduceOp::sum};
      ArenaCall call{k.kind, reinterpret_cast<std::byte*>(bufs[r].data()), k.count, k.dtype, k.op, 0, signature_of(k),
                     "allreduce", {}};
      results[r] = a.mapped[r].run(a.ranks[r], call, std::chrono::steady_clock::now() + 60s);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& r : results) {
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::invalid_argument);
    CHECK_THAT(r.error().message(), Catch::Contains("disagree"));
  }
}

TEST_CASE("host arena: a rank that never comes: abort() releases the others at once, a deadline on its own",
          "[collectives][arena]") {
  for (bool by_abort : {true, false}) {
    INFO((by_abort ? "abort" : "deadline"));
    Arenas a(4, 1 << 20);
    std::vector<troupe::Result<void>> results(3, troupe::Result<void>{});
    std::vector<std::vector<float>> bufs(3, std::vector<float>(100'000, 1.0f));
    auto deadline = std::chrono::steady_clock::now() + (by_abort ? 60s : 200ms);
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        ArenaCall call{CollectiveKind::allreduce, reinterpret_cast<std::byte*>(bufs[r].data()), 100'000,
                       DType::float32, ReduceOp::sum, 0, 7, "allreduce", {}};
        results[r] = a.mapped[r].run(a.ranks[r], call, deadline);
      });
    }
    // Rank 3's process "died": whoever notices breaks the arena, through
    // its own mapping.
    if (by_abort) a.mapped[3].abort();
    for (auto& t : threads) t.join();
    for (auto& r : results) {
      REQUIRE_FALSE(r.has_value());
      CHECK(r.error().code() == (by_abort ? ErrorCode::peer_lost : ErrorCode::timeout));
    }
    if (by_abort) {
      CHECK(a.made.broken());
      // And stays broken for later calls.
      std::vector<float> x(10, 1.0f);
      ArenaCall call{CollectiveKind::allreduce, reinterpret_cast<std::byte*>(x.data()), 10, DType::float32,
                     ReduceOp::sum, 0, 8, "allreduce", {}};
      CHECK(a.mapped[0].run(a.ranks[0], call, std::chrono::steady_clock::now() + 60s).error().code() ==
            ErrorCode::peer_lost);
    }
  }
}

TEST_CASE("host arena: an offer that is not an arena for the group is refused", "[collectives][arena]") {
  HostArena made = HostArena::create(4, 1 << 20).value();
  // Another rank count.
  auto wrong_ranks = HostArena::open(made.offer(), 3);
  REQUIRE_FALSE(wrong_ranks.has_value());
  CHECK_THAT(wrong_ranks.error().message(), Catch::Contains("not for 3 ranks"));
  // A slot segment of the right shape that is not an arena (no control block).
  SlotSegment plain = SlotSegment::create(9, made.offer().slot_bytes).value();
  auto not_arena = HostArena::open(plain.offer(), 4);
  REQUIRE_FALSE(not_arena.has_value());
  CHECK_THAT(not_arena.error().message(), Catch::Contains("not an arena"));
  // A made-up fd of this process.
  SlotsOffer bogus = made.offer();
  bogus.fd = 100'000;
  CHECK_FALSE(HostArena::open(bogus, 4).has_value());
}

TEST_CASE("host arena: slots are bounded in all and at least a page per rank", "[collectives][arena]") {
  CHECK(HostArena::slot_bytes_for(4, 4 << 20) == 4 << 20);
  CHECK(HostArena::slot_bytes_for(8, 4 << 20) == 2 << 20);
  CHECK(HostArena::slot_bytes_for(64, 4 << 20) == 256 << 10);
  CHECK(HostArena::slot_bytes_for(4, 1) == 4 * 4096);
  CHECK(HostArena::slot_bytes_for(3, 5000) % 4096 == 0);
}

TEST_CASE("host arena: buffers read in place match the reference bit for bit, alone or beside ordinary buffers",
          "[collectives][arena][in_place]") {
  for (uint32_t n : {2u, 3u, 4u, 8u}) {
    std::vector<Placement> placements{
        {std::vector<bool>(n, true)},                        // every rank in place
        {std::vector<bool>(n, true), 5},                     // at an offset in a larger buffer
        {[&] { std::vector<bool> v(n, false); v[0] = true; return v; }()},  // one rank only
        {[&] { std::vector<bool> v(n); for (uint32_t q = 0; q < n; ++q) v[q] = q % 2 == 1; return v; }()},
    };
    for (uint64_t chunk : {uint64_t{4096}, uint64_t{1} << 20}) {
      for (size_t p = 0; p < placements.size(); ++p) {
        INFO(n << " ranks, chunk " << chunk << ", placement " << p);
        Arenas a(n, chunk, Mapping::one);
        std::vector<std::string> errors;
        CHECK(run_all(a, in_place_cases(n), n * 11 + p, errors, placements[p]) == 0);
        for (auto& e : errors) CHECK(e.empty());
        // Every collective past the size for it went in place, on every rank
        // (each reads some registered buffer), and none below it.
        // With every buffer in place, the big allreduces wrote their results
        // straight into every rank's buffer; with some not, none did.
        size_t big = 0, big_allreduces = 0;
        for (const Case& k : in_place_cases(n)) {
          bool past = k.count * troupe::dtype_size(k.dtype) >= kInPlaceMinBytes;
          big += past;
          big_allreduces += past && k.kind == CollectiveKind::allreduce;
        }
        const bool every = std::count(placements[p].registered.begin(), placements[p].registered.end(), true) == n;
        for (const ArenaRank& me : a.ranks) {
          CHECK(me.in_place_calls == big);
          CHECK(me.direct_calls == (every ? big_allreduces : 0));
        }
      }
    }
  }
  // Segments laid out as runs (a host's column share), in place.
  const size_t count = 40'001;
  std::vector<std::vector<ElemRange>> columns(4);
  for (uint32_t q = 0; q < 4; ++q) columns[q] = {ring_segment(count, 8, q), ring_segment(count, 8, q + 4)};
  for (bool all : {true, false}) {
    INFO((all ? "every rank in place" : "ranks 1 and 2 in place"));
    Arenas a(4, 4096, Mapping::one);
    std::vector<std::string> errors;
    Placement where{all ? std::vector<bool>(4, true) : std::vector<bool>{false, true, true, false}};
    CHECK(run_all(a, in_place_cases(4, columns), 77, errors, where) == 0);
    for (auto& e : errors) CHECK(e.empty());
    for (const ArenaRank& me : a.ranks) CHECK((me.direct_calls > 0) == all);
  }
}

TEST_CASE("host arena: ranks in separate processes read each other's buffers in place, mapping and unmapping them",
          "[collectives][arena][in_place]") {
  // 4 processes (forked), each maps the arena and the others' buffers: a
  // fresh buffer per collective, so every rank's mappings of its peers'
  // buffers turn over, each freed one unmapped once its rank offers the next. The exit status is the number
  // of wrong elements (capped), 255 for an error.
  const uint32_t n = 4;
  HostArena made = HostArena::create(n, 256 << 10).value();
  std::vector<Case> cases = in_place_cases(n);
  std::vector<pid_t> children;
  for (uint32_t r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      auto arena = HostArena::open(made.offer(), n);
      if (!arena) ::_exit(255);
      ArenaRank me{r};
      size_t wrong = 0;
      for (const Placement& where : {Placement{{true, false, true, true}}, Placement{std::vector<bool>(n, true), 3}}) {
        for (size_t c = 0; c < cases.size(); ++c) {
          auto done = run_case(*arena, me, cases[c], inputs_of(cases[c], n, 500 + c), where);
          if (!done) {
            std::fprintf(stderr, "rank %u: %s\n", r, done.error().to_string().c_str());
            ::_exit(255);
          }
          wrong += *done;
        }
      }
      // Peers' buffers were read in place and mapped here; a peer's freed
      // buffers were unmapped once it offered a new one (it frees each
      // before its next collective): one mapping per peer is left.
      if (me.in_place_calls == 0 || me.peer_buffers.empty()) ::_exit(253);
      if (me.peer_buffers.size() > n - 1) ::_exit(254);
      for (const PeerBuffer& b : me.peer_buffers) {
        if (std::count_if(me.peer_buffers.begin(), me.peer_buffers.end(),
                          [&](const PeerBuffer& o) { return o.rank == b.rank; }) != 1) {
          ::_exit(254);
        }
      }
      // The second placement (every buffer in place) wrote results straight
      // into the others' buffers, through these mappings.
      if (me.direct_calls == 0) ::_exit(252);
      ::_exit(static_cast<int>(std::min<size_t>(wrong, 250)));
    }
    children.push_back(pid);
  }
  for (uint32_t r = 0; r < n; ++r) {
    int status = 0;
    REQUIRE(::waitpid(children[r], &status, 0) == children[r]);
    INFO("rank " << r);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

namespace {

/// What the forked ranks of the write-settling test tell the test process.
struct Settling {
  std::atomic<uint32_t> returned;  // survivors whose allreduce has failed
  std::atomic<uint32_t> check;     // set by the test: every writer has stopped
  std::atomic<int32_t> code[4];
  char message[4][512];
};

enum class Writer { running, stopped, stopped_then_killed };

/// Blocks while `word` (in memory shared across fork) holds `seen`, until
/// `until`: a futex wait that is not process-private, so that waiting ranks
/// leave the CPU to the rank whose writes they wait for (spinning ones
/// starved it past kWriterGrace on a loaded 2-core machine).
void wait_shared(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::steady_clock::time_point until) {
  while (word.load() == seen && std::chrono::steady_clock::now() < until) {
    timespec slice{0, 10'000'000};
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, seen, &slice, nullptr, 0);
  }
}

/// Wakes every process waiting in wait_shared on `word`.
void wake_shared(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

TEST_CASE("host arena: a rank whose allreduce fails gets its buffer back only once the others stopped writing into it",
          "[collectives][arena][in_place]") {
  // 4 forked ranks, every buffer in place, 16 MiB allreduces in a row: each
  // rank writes its segment's results into every rank's buffer. The test
  // (as the process that notices a failure would) breaks the arena while
  // rank 1 is writing, with rank 1
  //   running: the others fail with peer_lost, once rank 1 has stopped at
  //     its next block;
  //   stopped (SIGSTOP): they wait for it for kWriterGrace, then fail
  //     saying it may still write (it is then killed);
  //   stopped, then killed: they fail as soon as its process is gone (a
  //     zombie, not yet waited for).
  // Each survivor then fills its buffer with a sentinel, and checks, once
  // rank 1 can write no more, that nothing overwrote it.
  const uint32_t n = 4;
  const size_t count = size_t{4} << 20;  // floats
  for (Writer how : {Writer::running, Writer::stopped, Writer::stopped_then_killed}) {
    INFO("rank 1 " << (how == Writer::running ? "running" : how == Writer::stopped ? "stopped" : "stopped, then killed"));
    HostArena made = HostArena::create(n, 1 << 20).value();
    auto* shared = static_cast<Settling*>(
        ::mmap(nullptr, sizeof(Settling), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    REQUIRE(shared != MAP_FAILED);
    new (shared) Settling{};
    std::vector<pid_t> children;
    for (uint32_t r = 0; r < n; ++r) {
      pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid != 0) {
        children.push_back(pid);
        continue;
      }
      auto arena = HostArena::open(made.offer(), n);
      auto buffer = troupe::CollectiveBuffer::allocate(count * sizeof(float));
      if (!arena || !buffer) ::_exit(100);
      ArenaRank me{r};
      std::span<float> data = buffer->as<float>();
      std::fill(data.begin(), data.end(), 1.0f);
      for (int i = 0;; ++i) {
        if (i == 10'000) ::_exit(101);  // never broken
        ArenaCall call{CollectiveKind::allreduce, buffer->data(), count, DType::float32, ReduceOp::max, 0,
                       static_cast<uint64_t>(i + 1), "allreduce", {}};
        auto done = arena->run(me, call, std::chrono::steady_clock::now() + 60s);
        if (done) continue;
        shared->code[r].store(static_cast<int32_t>(done.error().code()));
        std::snprintf(shared->message[r], sizeof(shared->message[r]), "%s", done.error().message().c_str());
        break;
      }
      if (r == 1) ::_exit(0);
      // The buffer is this caller's again: write it, then look at it once
      // the test says rank 1 can no longer write.
      std::fill(data.begin(), data.end(), 7.0f);
      shared->returned.fetch_add(1);
      wake_shared(shared->returned);
      // Bounded: a test process that failed before saying so leaves no
      // rank behind holding the arena.
      wait_shared(shared->check, 0, std::chrono::steady_clock::now() + 120s);
      if (shared->check.load() == 0) ::_exit(103);
      ::_exit(std::all_of(data.begin(), data.end(), [](float x) { return x == 7.0f; }) ? 0 : 102);
    }
    auto give_up = std::chrono::steady_clock::now() + 60s;
    // Rank 1 in its write loop (and, for the stopped kinds, stopped there).
    bool caught = false;
    while (!caught && std::chrono::steady_clock::now() < give_up) {
      if (!made.writing(1)) {
        ::sched_yield();
        continue;
      }
      if (how == Writer::running) {
        caught = true;
        break;
      }
      REQUIRE(::kill(children[1], SIGSTOP) == 0);
      int status = 0;
      REQUIRE(::waitpid(children[1], &status, WUNTRACED) == children[1]);
      REQUIRE(WIFSTOPPED(status));
      caught = made.writing(1);
      if (!caught) REQUIRE(::kill(children[1], SIGCONT) == 0);  // stopped just past it: again
    }
    REQUIRE(caught);
    if (how == Writer::stopped_then_killed) REQUIRE(::kill(children[1], SIGKILL) == 0);
    auto broke = std::chrono::steady_clock::now();
    made.abort();
    for (uint32_t seen = shared->returned.load(); seen < n - 1; seen = shared->returned.load()) {
      if (std::chrono::steady_clock::now() >= give_up) break;
      wait_shared(shared->returned, seen, give_up);
    }
    REQUIRE(shared->returned.load() == n - 1);
    auto waited = std::chrono::steady_clock::now() - broke;
    if (how == Writer::stopped) {
      CHECK(waited >= kWriterGrace);
      REQUIRE(::kill(children[1], SIGKILL) == 0);
    } else {
      CHECK(waited < kWriterGrace);
    }
    int status = 0;
    REQUIRE(::waitpid(children[1], &status, 0) == children[1]);  // rank 1 writes no more
    if (how == Writer::running) CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    shared->check.store(1);
    wake_shared(shared->check);
    for (uint32_t r : {0u, 2u, 3u}) {
      INFO("rank " << r << ": " << shared->message[r]);
      REQUIRE(::waitpid(children[r], &status, 0) == children[r]);
      REQUIRE(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
      CHECK(shared->code[r].load() == static_cast<int32_t>(ErrorCode::peer_lost));
      const bool told = std::string(shared->message[r]).find("still writing") != std::string::npos;
      CHECK(told == (how == Writer::stopped));
    }
    ::munmap(shared, sizeof(Settling));
  }
}
