// Collectives inside a mesh's actors, across real processes: allreduce on a
// mesh of 8 worker processes over 2 agents, checked against a reference for
// several sizes (including ones not divisible by the member count), ops and
// types; a member's process killed mid-way fails the collective on every
// survivor (with the reason, not a timeout), and a new group made once the
// member is back reduces correctly.
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/host_id.h"
#include "collectives/ring.h"
#include "mesh/proc_anchor.h"
#include "support/local_cluster.h"
#include "troupe/collective_buffer.h"
#include "troupe/collective_group.h"
#include "troupe/mesh.h"

using namespace std::chrono_literals;
using troupe::DType;
using troupe::ErrorCode;
using troupe::ReduceOp;
using namespace troupe::test;

namespace {

struct SetGroup {
  troupe::CollectiveGroup group;
  TROUPE_MESSAGE_NAMED(SetGroup, "test.coll.SetGroup", group);
};
/// Fills `count` elements with the rank's pattern, allreduces them, and
/// answers with the result (as doubles).
struct RunAllReduce {
  uint64_t count = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t kind = 0;  // troupe::CollectiveKind
  uint32_t root = 0;
  /// The rank that asks for `odd_count` elements instead (bad input).
  uint32_t odd_rank = UINT32_MAX;
  uint64_t odd_count = 0;
  /// Ranks (bit r: rank r) whose buffer is a CollectiveBuffer.
  uint64_t registered = 0;
  /// When below 255: the kind odd_rank calls instead (bad input too).
  uint8_t odd_kind = 255;
  TROUPE_MESSAGE_NAMED(RunAllReduce, "test.coll.RunAllReduce", count, dtype, op, kind, root, odd_rank, odd_count,
                       registered, odd_kind);
};
/// Starts `copies` collectives at once on separate buffers of `count`
/// floats (allreduce sums and allgathers, alternating; copy k's values
/// offset by 1000 k) and answers, once all are done, how many elements of
/// each came out wrong.
struct RunAtOnce {
  uint64_t count = 0;
  uint32_t copies = 0;
  TROUPE_MESSAGE_NAMED(RunAtOnce, "test.coll.RunAtOnce", count, copies);
};
/// Runs `times` broadcasts of `count` floats from `root`, one after
/// another (broadcast k's values: the root's pattern + 1000 k), and answers
/// how many elements came out wrong in all.
struct RunBroadcasts {
  uint64_t count = 0;
  uint32_t times = 0;
  uint32_t root = 0;
  TROUPE_MESSAGE_NAMED(RunBroadcasts, "test.coll.RunBroadcasts", count, times, root);
};
struct MyPid {
  TROUPE_MESSAGE_NAMED(MyPid, "test.coll.MyPid");
};
/// The host id of the member's process (collectives/host_id.h).
struct MyHost {
  TROUPE_MESSAGE_NAMED(MyHost, "test.coll.MyHost");
};
/// How the chunks of the member's group came to its process: {in slots, in
/// messages, reduced straight into the next rank's slot, collectives done
/// through a host arena, of those the ones that also went between hosts,
/// bytes received in messages, pipelined pieces, arena stages that read a
/// CollectiveBuffer in place, of those the allreduces written in place, the
/// most broadcast chunks held before their collective got to them}.
struct ChunkCounts {
  TROUPE_MESSAGE_NAMED(ChunkCounts, "test.coll.ChunkCounts");
};

/// The rank whose segment element i is in (the layout reduce_scatter and
/// allgather document).
uint32_t owner_of(size_t i, size_t count, uint32_t ranks) {
  size_t q = count / ranks, m = count % ranks;
  for (uint32_t r = 0; r < ranks; ++r) {
    size_t begin = r * q + std::min<size_t>(r, m), len = q + (r < m ? 1 : 0);
    if (i >= begin && i < begin + len) return r;
  }
  return ranks;
}

double pattern(uint32_t rank, size_t i) { return static_cast<double>((rank + 1) * 3 + static_cast<int>(i % 11)) * 0.5; }

double expected(DType dtype, ReduceOp op, uint32_t ranks, size_t i);

class Reducer
    : public troupe::Actor<Reducer, SetGroup, RunAllReduce, RunAtOnce, RunBroadcasts, MyPid, MyHost, ChunkCounts> {
 public:
  void handle(const SetGroup& m) { group_ = m.group; }
  int64_t handle(const MyPid&) { return getpid(); }
  std::string handle(const MyHost&) { return troupe::collectives::host_id(); }
  troupe::Deferred<std::vector<uint64_t>> handle(const ChunkCounts&) {
    auto reply = defer<std::vector<uint64_t>>();
    ask<troupe::mesh::GroupCounters>(group_.engine(self()), troupe::mesh::GroupStats{group_.id})
        .then([reply](troupe::Result<troupe::mesh::GroupCounters> r) mutable {
          if (!r) return reply.fail(r.error());
          reply.complete(std::vector<uint64_t>{r->chunks_in_slots, r->chunks_in_messages, r->reduced_into_slots,
                                               r->arena_collectives, r->hierarchical_collectives,
                                               r->bytes_in_messages, r->pipelined_pieces, r->arena_in_place,
                                               r->arena_written_in_place, r->most_tree_chunks_waiting});
        });
    return reply;
  }

  troupe::Deferred<std::vector<uint64_t>> handle(const RunAtOnce& m) {
    auto reply = defer<std::vector<uint64_t>>();
    auto bufs = std::make_shared<std::vector<std::vector<float>>>(m.copies);
    auto wrong = std::make_shared<std::vector<uint64_t>>(m.copies, 0);
    auto left = std::make_shared<uint32_t>(m.copies);
    auto failed = std::make_shared<troupe::Status>();
    uint32_t n = group_.size, me = group_.rank;
    size_t count = m.count;
    for (uint32_t k = 0; k < m.copies; ++k) {
      bool gather = k % 2 == 1;
      auto& buf = (*bufs)[k];
      buf.assign(count, 0.0f);
      for (size_t i = 0; i < count; ++i) {
        if (!gather || owner_of(i, count, n) == me) buf[i] = static_cast<float>(pattern(me, i) + 1000.0 * k);
      }
      ask<void>(group_.engine(self()),
                troupe::Collective{group_.id, me, buf.data(), count, DType::float32, ReduceOp::sum,
                                   gather ? troupe::CollectiveKind::allgather : troupe::CollectiveKind::allreduce, 0},
                60s)
          .then([reply, bufs, wrong, left, failed, k, gather, n, count](troupe::Result<void> r) mutable {
            if (!r && failed->ok()) *failed = r.error();
            if (r) {
              for (size_t i = 0; i < count; ++i) {
                double want = gather ? pattern(owner_of(i, count, n), i) + 1000.0 * k
                                     : expected(DType::float32, ReduceOp::sum, n, i) + 1000.0 * k * n;
                (*wrong)[k] += (*bufs)[k][i] != static_cast<float>(want);
              }
            }
            if (--*left > 0) return;
            failed->ok() ? reply.complete(*wrong) : reply.fail(*failed);
          });
    }
    return reply;
  }

  troupe::Deferred<uint64_t> handle(const RunBroadcasts& m) {
    auto reply = defer<uint64_t>();
    auto buf = std::make_shared<std::vector<float>>();
    auto wrong = std::make_shared<uint64_t>(0);
    next_broadcast(m, 0, buf, wrong, reply);
    return reply;
  }

  troupe::Deferred<std::vector<double>> handle(const RunAllReduce& m) {
    auto reply = defer<std::vector<double>>();
    auto dtype = static_cast<DType>(m.dtype);
    const bool odd = group_.rank == m.odd_rank;
    auto kind = static_cast<troupe::CollectiveKind>(odd && m.odd_kind < 255 ? m.odd_kind : m.kind);
    size_t n = odd ? m.odd_count : m.count;
    // What this rank puts in: its pattern everywhere (reductions), only in
    // its own segment (allgather), or only at the root (broadcast).
    auto contributes = [&](size_t i) {
      if (kind == troupe::CollectiveKind::allgather) return owner_of(i, n, group_.size) == group_.rank;
      if (kind == troupe::CollectiveKind::broadcast) return group_.rank == m.root;
      return true;
    };
    // Either buffer holds 4-byte elements: float32 or int32.
    void* data = nullptr;
    if ((m.registered >> group_.rank & 1) != 0 && n > 0) {
      auto b = troupe::CollectiveBuffer::allocate(n * 4);
      if (!b) {
        reply.fail(b.error());
        return reply;
      }
      shared_ = std::move(*b);
      data = shared_.data();
    } else {
      f32_.assign(n, 0.0f);
      data = f32_.data();
    }
    auto* f32 = static_cast<float*>(data);
    auto* i32 = static_cast<int32_t*>(data);
    for (size_t i = 0; i < n; ++i) {
      if (dtype == DType::float32) {
        f32[i] = contributes(i) ? static_cast<float>(pattern(group_.rank, i)) : 0.0f;
      } else {
        i32[i] = contributes(i) ? static_cast<int32_t>(pattern(group_.rank, i) * 2) : 0;
      }
    }
    ask<void>(group_.engine(self()),
              troupe::Collective{group_.id, group_.rank, data, n, dtype, static_cast<ReduceOp>(m.op), kind, m.root},
              60s)
        .then([reply, dtype, n, f32, i32](troupe::Result<void> r) mutable {
          if (!r) return reply.fail(r.error());
          std::vector<double> out(n);
          for (size_t i = 0; i < n; ++i) out[i] = dtype == DType::float32 ? f32[i] : i32[i];
          reply.complete(std::move(out));
        });
    return reply;
  }

 private:
  // RunBroadcasts' broadcast k, then the next once it is done.
  void next_broadcast(const RunBroadcasts& m, uint32_t k, std::shared_ptr<std::vector<float>> buf,
                      std::shared_ptr<uint64_t> wrong, troupe::Deferred<uint64_t> reply) {
    if (k == m.times) return reply.complete(*wrong);
    buf->assign(m.count, 0.0f);
    if (group_.rank == m.root) {
      for (size_t i = 0; i < m.count; ++i) (*buf)[i] = static_cast<float>(pattern(m.root, i) + 1000.0 * k);
    }
    ask<void>(group_.engine(self()),
              troupe::Collective{group_.id, group_.rank, buf->data(), m.count, DType::float32, ReduceOp::sum,
                                 troupe::CollectiveKind::broadcast, m.root},
              60s)
        .then([this, m, k, buf, wrong, reply](troupe::Result<void> r) mutable {
          if (!r) return reply.fail(r.error());
          for (size_t i = 0; i < m.count; ++i) *wrong += (*buf)[i] != static_cast<float>(pattern(m.root, i) + 1000.0 * k);
          next_broadcast(m, k + 1, buf, wrong, reply);
        });
  }

  troupe::CollectiveGroup group_;
  std::vector<float> f32_;               // an ordinary buffer, or
  troupe::CollectiveBuffer shared_;      // one read in place by the host's other ranks
};

/// How many mappings of collective shared memory (arenas, ring slots)
/// process `pid` has.
size_t shared_mappings(int64_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("troupe-collective-slots") != std::string::npos;
  return n;
}

/// The expected result at element i for `ranks` members.
double expected(DType dtype, ReduceOp op, uint32_t ranks, size_t i) {
  double acc = 0;
  for (uint32_t r = 0; r < ranks; ++r) {
    double v = dtype == DType::float32 ? pattern(r, i) : static_cast<double>(static_cast<int32_t>(pattern(r, i) * 2));
    if (r == 0 || op == ReduceOp::sum || op == ReduceOp::avg) {
      acc = r == 0 ? v : acc + v;
    } else {
      acc = op == ReduceOp::max ? std::max(acc, v) : std::min(acc, v);
    }
  }
  if (op == ReduceOp::avg) {
    acc = dtype == DType::float32 ? static_cast<double>(static_cast<float>(acc) / static_cast<float>(ranks))
                                  : static_cast<double>(static_cast<int64_t>(acc) / static_cast<int64_t>(ranks));
  }
  return acc;
}

/// The 8-process mesh with a Reducer in each process (over agents with
/// these host ids, when given, placed by `strategy`).
struct CollectiveCluster : EightProcessMesh {
  CollectiveCluster() = default;
  CollectiveCluster(const std::vector<std::string>& host_ids,
                    troupe::PlacementStrategy strategy = troupe::PlacementStrategy::pack)
      : EightProcessMesh(host_ids, strategy) {}
  troupe::ActorMesh<Reducer> mesh = procs.spawn<Reducer>({.max_restarts = -1}).value();

  void give_groups(const troupe::ActorMesh<Reducer>& view, std::chrono::milliseconds timeout = 30s) {
    give_groups(view, troupe::GroupOptions{.timeout = timeout});
  }
  void give_groups(const troupe::ActorMesh<Reducer>& view, const troupe::GroupOptions& options) {
    auto groups = view.make_group(options).value();
    for (size_t i = 0; i < view.size(); ++i) REQUIRE(view.member(i).ask(SetGroup{groups[i]}).get().has_value());
  }
};

/// How many of `view`'s members are on each host id.
std::map<std::string, size_t> members_per_host(const troupe::ActorMesh<Reducer>& view) {
  std::map<std::string, size_t> per_host;
  for (size_t m = 0; m < view.size(); ++m) ++per_host[view.member(m).ask(MyHost{}).get().value()];
  return per_host;
}

/// The view's members, in view order.
std::vector<troupe::ActorRef<Reducer>> members_of(const troupe::ActorMesh<Reducer>& view) {
  std::vector<troupe::ActorRef<Reducer>> out;
  for (size_t i = 0; i < view.size(); ++i) out.push_back(view.member(i));
  return out;
}

/// Asks every rank (`ranks[r]` holds rank r's handle) to run `m` at once
/// and waits for every answer.
std::vector<troupe::Result<std::vector<double>>> run_on(const std::vector<troupe::ActorRef<Reducer>>& ranks,
                                                         const RunAllReduce& m) {
  std::vector<troupe::Future<std::vector<double>>> asked;
  for (const auto& r : ranks) asked.push_back(r.ask(m, 60s));
  std::vector<troupe::Result<std::vector<double>>> out;
  for (auto& f : asked) out.push_back(f.get());
  return out;
}

/// Runs every kind of collective on `ranks` (rank r's member first; their
/// group given) for a few sizes, types and ops, checking every member's
/// result; `registered`: the ranks whose buffers are CollectiveBuffers
/// (RunAllReduce::registered).
void check_every_kind(const std::vector<troupe::ActorRef<Reducer>>& ranks, uint64_t registered = 0) {
  auto n = static_cast<uint32_t>(ranks.size());
  using troupe::CollectiveKind;
  struct Case {
    CollectiveKind kind;
    size_t count;
    DType dtype;
    ReduceOp op;
    uint32_t root = 0;
  };
  for (const Case& k : std::vector<Case>{{CollectiveKind::allreduce, 0, DType::float32, ReduceOp::sum},
                                         {CollectiveKind::allreduce, 1, DType::float32, ReduceOp::sum},
                                         {CollectiveKind::allreduce, 7, DType::float32, ReduceOp::avg},
                                         {CollectiveKind::allreduce, 1001, DType::int32, ReduceOp::max},
                                         {CollectiveKind::allreduce, 4099, DType::int32, ReduceOp::avg},
                                         {CollectiveKind::allreduce, 300'001, DType::float32, ReduceOp::avg},
                                         {CollectiveKind::reduce_scatter, 5, DType::float32, ReduceOp::sum},
                                         {CollectiveKind::reduce_scatter, 100'003, DType::float32, ReduceOp::avg},
                                         {CollectiveKind::allgather, 5, DType::float32, ReduceOp::sum},
                                         {CollectiveKind::allgather, 70'001, DType::int32, ReduceOp::sum},
                                         {CollectiveKind::broadcast, 50'000, DType::float32, ReduceOp::sum, n - 1},
                                         {CollectiveKind::broadcast, 3, DType::int32, ReduceOp::sum, 1},
                                         {CollectiveKind::barrier, 0, DType::float32, ReduceOp::sum}}) {
    INFO("kind " << static_cast<int>(k.kind) << ": count " << k.count << " dtype " << troupe::dtype_name(k.dtype)
                 << " op " << troupe::op_name(k.op) << " root " << k.root);
    auto results = run_on(ranks, RunAllReduce{k.count, static_cast<uint8_t>(k.dtype), static_cast<uint8_t>(k.op),
                                              static_cast<uint8_t>(k.kind), k.root, UINT32_MAX, 0, registered});
    for (uint32_t r = 0; r < n; ++r) {
      INFO("member " << r << ": " << (results[r] ? std::string("ok") : results[r].error().to_string()));
      REQUIRE(results[r].has_value());
      const auto& got = *results[r];
      REQUIRE(got.size() == k.count);
      size_t wrong = 0;
      for (size_t i = 0; i < k.count; ++i) {
        double in = k.dtype == DType::float32 ? pattern(owner_of(i, k.count, n), i)
                                              : static_cast<double>(static_cast<int32_t>(pattern(owner_of(i, k.count, n), i) * 2));
        switch (k.kind) {
          case CollectiveKind::allreduce: wrong += got[i] != expected(k.dtype, k.op, n, i); break;
          case CollectiveKind::reduce_scatter:
            if (owner_of(i, k.count, n) == r) wrong += got[i] != expected(k.dtype, k.op, n, i);
            break;
          case CollectiveKind::allgather: wrong += got[i] != in; break;
          case CollectiveKind::broadcast:
            wrong += got[i] != (k.dtype == DType::float32 ? pattern(k.root, i)
                                                          : static_cast<double>(static_cast<int32_t>(pattern(k.root, i) * 2)));
            break;
          case CollectiveKind::barrier: break;
        }
      }
      CHECK(wrong == 0);
    }
  }
}

void check_every_kind(const troupe::ActorMesh<Reducer>& view, uint64_t registered = 0) {
  check_every_kind(members_of(view), registered);
}

}  // namespace

TEST_CASE("collectives: a group over two hosts reduces in each host's arena and between the hosts in rings of one "
          "rank per host, every kind matching the reference",
          "[cluster][collectives][hierarchical]") {
  // Two agents that stand for two hosts: their processes never share memory.
  // PACK: ranks 0-3 on one, 4-7 on the other.
  CollectiveCluster c({"host-a", "host-b"});
  auto per_host = members_per_host(c.mesh);
  REQUIRE(per_host.size() == 2);
  REQUIRE(per_host.begin()->second == 4);  // 4 + 4: four two-rank rings between the hosts
  // 64 KiB chunks: the largest allreduce's column rings pipeline several.
  c.give_groups(c.mesh, troupe::GroupOptions{.chunk_bytes = 64 << 10});
  check_every_kind(c.mesh);
  auto counts = c.mesh.call(ChunkCounts{});
  REQUIRE(counts.ok());
  for (size_t m = 0; m < 8; ++m) {
    INFO("member " << m);
    // allreduce (6), reduce_scatter (2), allgather (2), broadcast (2) and
    // barrier (1) all went through the arenas and between the hosts.
    CHECK((*counts[m])[3] == 13);
    CHECK((*counts[m])[4] == 13);
    // Every rank's column ring crosses to the other host: by message.
    CHECK((*counts[m])[1] > 0);
    // The allreduce of 300,001 floats (1.2 MB: 9 pieces of at least two
    // chunks of 64 KiB, so pipelined) in 9 pieces; the smaller ones in one.
    CHECK((*counts[m])[6] == 9);
  }

  // Collectives started at once, without waiting for each other, run in
  // the order they were called on every rank, whatever order their stages
  // finish in: each host's arena takes their stages in the same order on
  // all its ranks.
  // The same for the ring over all ranks (shared-memory slots between
  // neighbours on a host, taken by whichever collective comes first).
  auto run_at_once = [&] {
    for (int round = 0; round < 3; ++round) {
      auto at_once = c.mesh.call(RunAtOnce{100'003, 6}, 60s);
      INFO((at_once.ok() ? std::string("ok") : at_once.errors()[0].second.to_string()));
      REQUIRE(at_once.ok());
      for (size_t m = 0; m < 8; ++m) CHECK(*at_once[m] == std::vector<uint64_t>(6, 0));
    }
  };
  run_at_once();
  c.give_groups(c.mesh, troupe::GroupOptions{.host_arena = false, .chunk_bytes = 4096});
  run_at_once();

  // What crosses between the hosts, per rank, for a collective of S =
  // 320,000 bytes a rank (8 segments of S/8), as a new group's second one
  // (the ring's slots are mapped by then); its result checked on rank 6.
  using troupe::CollectiveKind;
  auto bytes_between_hosts = [&](const troupe::GroupOptions& options, CollectiveKind kind) {
    c.give_groups(c.mesh, options);
    auto received = [&] {
      auto counts = c.mesh.call(ChunkCounts{});
      REQUIRE(counts.ok());
      std::vector<uint64_t> bytes;
      for (size_t m = 0; m < 8; ++m) bytes.push_back((*counts[m])[5]);
      return bytes;
    };
    std::vector<uint64_t> before;
    for (int round = 0; round < 2; ++round) {
      before = received();
      auto r = c.mesh.call(RunAllReduce{80'000, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum),
                                        static_cast<uint8_t>(kind)});
      REQUIRE(r.ok());
      for (size_t i = 0; i < 80'000; i += 997) {
        if (kind == CollectiveKind::allgather) {
          CHECK((*r[6])[i] == pattern(owner_of(i, 80'000, 8), i));
        } else if (kind == CollectiveKind::allreduce || owner_of(i, 80'000, 8) == 6) {
          CHECK((*r[6])[i] == expected(DType::float32, ReduceOp::sum, 8, i));
        }
      }
    }
    std::vector<uint64_t> after = received();
    for (size_t m = 0; m < 8; ++m) after[m] -= before[m];
    return after;
  };
  // allreduce: 2S in all, each rank's two-rank ring moving S/4 its way,
  // against 3.5S for the ring over all ranks (its two edges between the
  // hosts carry 2 x 7/8 S each), the rest of the ring's data in shared
  // memory. Every rank's link carries its share, not S through leaders.
  CHECK(bytes_between_hosts(troupe::GroupOptions{}, CollectiveKind::allreduce) ==
        std::vector<uint64_t>(8, 320'000 / 4));
  // Pipelined (4 KiB chunks: 32 pieces of 10,000 bytes, each piece's
  // column rings running while the next is reduced in the arenas): the same
  // bytes between the hosts, and each allreduce counted once.
  CHECK(bytes_between_hosts(troupe::GroupOptions{.chunk_bytes = 4096}, CollectiveKind::allreduce) ==
        std::vector<uint64_t>(8, 320'000 / 4));
  auto piecewise = c.mesh.call(ChunkCounts{});
  REQUIRE(piecewise.ok());
  for (size_t m = 0; m < 8; ++m) {
    CHECK((*piecewise[m])[3] == 2);       // two allreduces through the arenas
    CHECK((*piecewise[m])[6] == 2 * 32);  // in 32 pieces each (two chunks a piece would be 39)
  }
  // Or in one piece, as asked; a count of pieces out of range is refused.
  CHECK(bytes_between_hosts(troupe::GroupOptions{.chunk_bytes = 4096, .pipeline_pieces = 1},
                            CollectiveKind::allreduce) == std::vector<uint64_t>(8, 320'000 / 4));
  auto whole = c.mesh.call(ChunkCounts{});
  REQUIRE(whole.ok());
  for (size_t m = 0; m < 8; ++m) CHECK((*whole[m])[6] == 0);
  for (uint32_t bad : {0u, 65u}) {
    auto refused = c.mesh.make_group(troupe::GroupOptions{.pipeline_pieces = bad});
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code() == ErrorCode::invalid_argument);
    CHECK_THAT(refused.error().message(), Catch::Contains("pipeline_pieces"));
  }
  // reduce_scatter and allgather: S in all, each rank getting the one
  // segment (S/8) of its column on the other host, the least there is;
  // the ring over all ranks moves 7/8 S over each of its two crossings.
  CHECK(bytes_between_hosts(troupe::GroupOptions{}, CollectiveKind::reduce_scatter) ==
        std::vector<uint64_t>(8, 320'000 / 8));
  CHECK(bytes_between_hosts(troupe::GroupOptions{}, CollectiveKind::allgather) ==
        std::vector<uint64_t>(8, 320'000 / 8));
  CHECK(bytes_between_hosts(troupe::GroupOptions{.host_arena = false}, CollectiveKind::allreduce) ==
        std::vector<uint64_t>{560'000, 0, 0, 0, 560'000, 0, 0, 0});
  CHECK(bytes_between_hosts(troupe::GroupOptions{.host_arena = false}, CollectiveKind::reduce_scatter) ==
        std::vector<uint64_t>{280'000, 0, 0, 0, 280'000, 0, 0, 0});
  CHECK(bytes_between_hosts(troupe::GroupOptions{.host_arena = false}, CollectiveKind::allgather) ==
        std::vector<uint64_t>{280'000, 0, 0, 0, 280'000, 0, 0, 0});

  // That flat ring (the last group) moves chunks through shared memory
  // exactly from a neighbour on the same host (all but ranks 0 and 4),
  // never between the hosts.
  counts = c.mesh.call(ChunkCounts{});
  REQUIRE(counts.ok());
  size_t fed_by_a_neighbour = 0;
  for (size_t m = 0; m < 8; ++m) {
    bool same_host_before = c.mesh.member(m).ask(MyHost{}).get().value() ==
                            c.mesh.member((m + 7) % 8).ask(MyHost{}).get().value();
    INFO("member " << m << (same_host_before ? ", the rank before it on its host" : ", the rank before it elsewhere"));
    CHECK(((*counts[m])[0] > 0) == same_host_before);
    CHECK((*counts[m])[3] == 0);  // no arena
    fed_by_a_neighbour += same_host_before;
  }
  CHECK(fed_by_a_neighbour == 6);
}

TEST_CASE("collectives: a broadcast of many chunks goes down the tree chunk by chunk, at most four unacknowledged on "
          "an edge, between hosts only once",
          "[cluster][collectives][hierarchical]") {
  CollectiveCluster c({"host-a", "host-b"});
  REQUIRE(members_per_host(c.mesh).size() == 2);
  auto ranks = members_of(c.mesh);
  constexpr uint64_t kCount = 40'000;  // 160,000 bytes: 40 chunks of 4 KiB
  auto counts_now = [&] {
    auto counts = c.mesh.call(ChunkCounts{});
    REQUIRE(counts.ok());
    std::vector<std::vector<uint64_t>> out;
    for (size_t m = 0; m < 8; ++m) out.push_back(*counts[m]);
    return out;
  };
  auto check_result = [&](const troupe::Result<std::vector<double>>& got, uint32_t root) {
    INFO((got ? std::string("ok") : got.error().to_string()));
    REQUIRE(got.has_value());
    REQUIRE(got->size() == kCount);
    size_t wrong = 0;
    for (size_t i = 0; i < kCount; ++i) wrong += (*got)[i] != pattern(root, i);
    CHECK(wrong == 0);
  };
  RunAllReduce broadcast{kCount, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum),
                         static_cast<uint8_t>(troupe::CollectiveKind::broadcast), 3};

  // Every rank by messages, no arenas: 40 chunks over 8 ranks go down the
  // chain 3, 4, ..., 1, 2 (faster than the binomial tree's 3 sends of each
  // chunk from the root; the shape is collectives_algo_test's to check).
  // Rank 2, last, calls late: rank 1 sends it four chunks and waits for it.
  c.give_groups(c.mesh, troupe::GroupOptions{.timeout = 120s, .shared_memory = false, .host_arena = false,
                                             .chunk_bytes = 4096});
  std::vector<troupe::Future<std::vector<double>>> asked;
  for (uint32_t r = 0; r < 8; ++r) {
    if (r != 2) asked.push_back(ranks[r].ask(broadcast, 60s));
  }
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (counts_now()[2][9] < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);  // polling another process's counters
  }
  REQUIRE(counts_now()[2][9] == 4);
  asked.push_back(ranks[2].ask(broadcast, 60s));
  for (auto& f : asked) check_result(f.get(), 3);
  auto chained = counts_now();
  for (uint32_t r = 0; r < 8; ++r) {
    INFO("rank " << r);
    CHECK(chained[r][9] <= 4);  // never more than the window before its turn
    CHECK(chained[r][1] == (r == 3 ? 0u : 40u));  // every chunk once, from its parent
    CHECK(chained[r][5] == (r == 3 ? 0u : kCount * 4));
  }

  // Through the arenas: the chunks cross between the hosts once, from the
  // root (rank 5, leading its host) to the other host's leader (rank 0),
  // and each host's arena takes them to its ranks.
  REQUIRE(ranks[0].ask(MyHost{}).get().value() != ranks[5].ask(MyHost{}).get().value());
  broadcast.root = 5;
  c.give_groups(c.mesh, troupe::GroupOptions{.chunk_bytes = 4096});
  auto results = run_on(ranks, broadcast);
  for (const auto& got : results) check_result(got, 5);
  auto tree = counts_now();
  for (uint32_t r = 0; r < 8; ++r) {
    INFO("rank " << r);
    CHECK(tree[r][1] == (r == 0 ? 40u : 0u));
    CHECK(tree[r][5] == (r == 0 ? kCount * 4 : 0u));
    CHECK(tree[r][4] == 1);  // one collective through the arenas and between the hosts
  }
}

TEST_CASE("collectives: a rank that has not called holds at most four broadcast chunks, however many broadcasts "
          "the others go on to: they wait for it",
          "[cluster][collectives]") {
  CollectiveCluster c;
  auto ranks = members_of(c.mesh);
  // One chunk a broadcast, by messages: without a window across
  // collectives, rank 2's parent would finish all 40 and park 40 chunks in
  // rank 2's process; with it, it parks four and waits (and the ranks
  // before it, in turn, once it stops taking theirs).
  c.give_groups(c.mesh, troupe::GroupOptions{.timeout = 120s, .shared_memory = false, .host_arena = false,
                                             .chunk_bytes = 4096});
  const RunBroadcasts many{1000, 40, 3};
  auto waiting_at_2 = [&] {
    auto counts = ranks[2].ask(ChunkCounts{}).get();
    REQUIRE(counts.has_value());
    return (*counts)[9];
  };
  std::vector<troupe::Future<uint64_t>> asked;
  for (uint32_t r = 0; r < 8; ++r) {
    if (r != 2) asked.push_back(ranks[r].ask(many, 60s));
  }
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (waiting_at_2() < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);  // polling another process's counters
  }
  REQUIRE(waiting_at_2() == 4);
  // The claim is that nothing more comes: watched for two seconds, in which
  // the 40 small broadcasts would otherwise all be sent (milliseconds each).
  deadline = std::chrono::steady_clock::now() + 2s;
  while (std::chrono::steady_clock::now() < deadline) {
    REQUIRE(waiting_at_2() == 4);
    std::this_thread::sleep_for(50ms);
  }
  // Nobody finished: rank 2's subtree waits for it, and the back-pressure
  // reaches the root (three levels of four-chunk windows before broadcast 40).
  for (auto& f : asked) CHECK_FALSE(f.ready());
  asked.push_back(ranks[2].ask(many, 60s));
  for (auto& f : asked) {
    auto wrong = f.get();
    INFO((wrong ? std::string("ok") : wrong.error().to_string()));
    REQUIRE(wrong.has_value());
    CHECK(*wrong == 0);
  }
  for (uint32_t r = 0; r < 8; ++r) {
    INFO("rank " << r);
    auto counts = ranks[r].ask(ChunkCounts{}).get();
    REQUIRE(counts.has_value());
    CHECK((*counts)[9] <= 4);
    CHECK((*counts)[1] == (r == 3 ? 0u : 40u));  // each broadcast's chunk once, from its parent
  }
}

TEST_CASE("collectives: a group over hosts with different numbers of ranks reduces through the hosts' leaders",
          "[cluster][collectives][hierarchical]") {
  // Agents a1 and a2 share a host id (one host of two agents), a3 has its own:
  // SPREAD puts 3, 3 and 2 members on them, so 5 or 6 on the first host.
  CollectiveCluster c({"host-x", "host-x", "host-y"}, troupe::PlacementStrategy::spread);
  auto per_host = members_per_host(c.mesh);
  REQUIRE(per_host.size() == 2);
  REQUIRE(per_host.begin()->second != per_host.rbegin()->second);
  c.give_groups(c.mesh, troupe::GroupOptions{.chunk_bytes = 64 << 10});
  check_every_kind(c.mesh);
  auto counts = c.mesh.call(ChunkCounts{});
  REQUIRE(counts.ok());
  for (size_t m = 0; m < 8; ++m) {
    size_t alongside = per_host[c.mesh.member(m).ask(MyHost{}).get().value()];
    INFO("member " << m << ", on a host with " << alongside << " members");
    // A member alone on its host has no arena: its part is the leaders' ring.
    CHECK((*counts[m])[4] == (alongside > 1 ? 11 : 0));
  }
  // A slice all on one host is a single arena again.
  auto on_x = c.mesh.flatten("members").range("members", 0, 2).value();
  REQUIRE(members_per_host(on_x).size() == 1);
  c.give_groups(on_x);
  REQUIRE(on_x.call(RunAllReduce{10, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum)}).ok());
  auto single = on_x.call(ChunkCounts{});
  REQUIRE(single.ok());
  CHECK((*single[0])[3] == 1);
  CHECK((*single[0])[4] == 0);
}

TEST_CASE("collectives: allreduce across 8 processes matches the reference for sizes, ops and types, on every "
          "data path",
          "[cluster][collectives]") {
  CollectiveCluster c;
  struct Case {
    size_t count;
    DType dtype;
    ReduceOp op;
  };
  std::vector<Case> cases = {{0, DType::float32, ReduceOp::sum},      {1, DType::float32, ReduceOp::sum},
                             {7, DType::float32, ReduceOp::sum},      {1001, DType::float32, ReduceOp::max},
                             {1001, DType::float32, ReduceOp::min},   {4099, DType::float32, ReduceOp::avg},
                             {300'001, DType::float32, ReduceOp::sum}, {1003, DType::int32, ReduceOp::sum},
                             {1003, DType::int32, ReduceOp::avg}};
  // The host arena (all 8 processes are on this host), with 4 KiB chunks
  // too (a page per rank and round: the largest case takes 37 rounds); the
  // ring through shared memory with 4 MiB chunks, and with 4 KiB chunks (37
  // per segment of the largest case, more than the 8 slots: senders wait for
  // slots back); and the ring with messages only.
  struct Path {
    const char* name;
    troupe::GroupOptions options;
  };
  for (const Path& path : {Path{"arena", {}}, Path{"arena, 4 KiB chunks", {.chunk_bytes = 4096}},
                           Path{"ring, shared memory", {.host_arena = false}},
                           Path{"ring, shared memory, 4 KiB chunks", {.host_arena = false, .chunk_bytes = 4096}},
                           Path{"ring, messages", {.shared_memory = false}}}) {
    c.give_groups(c.mesh, path.options);
    for (auto& k : cases) {
      INFO(path.name << ": count " << k.count << " dtype " << troupe::dtype_name(k.dtype) << " op "
                     << troupe::op_name(k.op));
      auto results =
          c.mesh.call(RunAllReduce{k.count, static_cast<uint8_t>(k.dtype), static_cast<uint8_t>(k.op)}, 60s);
      REQUIRE(results.ok());
      for (size_t m = 0; m < results.size(); ++m) {
        const auto& got = *results[m];
        REQUIRE(got.size() == k.count);
        size_t wrong = 0;
        for (size_t i = 0; i < k.count; ++i) wrong += got[i] != expected(k.dtype, k.op, 8, i);
        CHECK(wrong == 0);
      }
    }
  }
  // A slice is a group of its own: host 1's four members.
  auto host1 = c.mesh.slice({{"hosts", 1}}).value();
  c.give_groups(host1);
  auto four = host1.call(RunAllReduce{10, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum)});
  REQUIRE(four.ok());
  for (size_t i = 0; i < 10; ++i) CHECK((*four[0])[i] == expected(DType::float32, ReduceOp::sum, 4, i));
}

TEST_CASE("collectives: a member's process killed during an allreduce fails it on every survivor, a new group "
          "works once it is back",
          "[cluster][collectives]") {
  // On one host (one arena), and on two (arenas, and rings between them);
  // with ordinary buffers, and with CollectiveBuffers read in place by the
  // other ranks (the victim's too: its memory stays mapped by them).
  const bool two_hosts = GENERATE(false, true);
  const bool in_place = GENERATE(false, true);
  INFO((two_hosts ? "two hosts" : "one host") << (in_place ? ", buffers read in place" : ""));
  auto cluster = two_hosts ? std::make_unique<CollectiveCluster>(std::vector<std::string>{"host-a", "host-b"})
                           : std::make_unique<CollectiveCluster>();
  CollectiveCluster& c = *cluster;
  // Two hosts: 64 KiB chunks, so the allreduce runs pipelined in 3 pieces
  // (each survivor still gets one answer).
  c.give_groups(c.mesh, troupe::GroupOptions{.chunk_bytes = two_hosts ? uint64_t{64} << 10 : uint64_t{4} << 20});
  int64_t victim = c.mesh.member(7).ask(MyPid{}).get().value();
  // Seven members start; the eighth never will: its process is killed.
  auto seven = c.mesh.flatten("members").range("members", 0, 7).value();
  auto stream = seven.stream(RunAllReduce{100'000, static_cast<uint8_t>(DType::float32),
                                          static_cast<uint8_t>(ReduceOp::sum), 0, 0, UINT32_MAX, 0,
                                          in_place ? uint64_t{0xff} : 0},
                             60s);
  REQUIRE(::kill(static_cast<pid_t>(victim), SIGKILL) == 0);
  size_t failed = 0;
  while (auto reply = stream.next()) {
    REQUIRE_FALSE(reply->second.has_value());
    // The survivors learn it from the lost process, not from a timeout.
    CHECK(reply->second.error().code() == ErrorCode::peer_lost);
    CHECK_THAT(reply->second.error().message(), Catch::Contains("rank 7"));
    ++failed;
  }
  CHECK(failed == 7);
  // Once member 7 is back (its process restarted), a new group works.
  troupe::Result<int64_t> back = troupe::error(ErrorCode::timeout, "not yet");
  for (int i = 0; i < 100 && !back; ++i) back = c.mesh.member(7).ask(MyPid{}, 5s).get();
  REQUIRE(back.has_value());
  CHECK(*back != victim);
  c.give_groups(c.mesh);
  auto again = c.mesh.call(RunAllReduce{100'000, static_cast<uint8_t>(DType::float32),
                                        static_cast<uint8_t>(ReduceOp::sum), 0, 0, UINT32_MAX, 0,
                                        in_place ? uint64_t{0xff} : 0});
  REQUIRE(again.ok());
  size_t wrong = 0;
  for (size_t i = 0; i < 100'000; ++i) wrong += (*again[7])[i] != expected(DType::float32, ReduceOp::sum, 8, i);
  CHECK(wrong == 0);
}

TEST_CASE("collectives: a group across two meshes runs every kind over both whether their processes are apart or "
          "one holds a rank of each, and a rank's process killed fails a broadcast on the other mesh's ranks",
          "[cluster][collectives][cross_mesh]") {
  // Rank 0 from one mesh (a trainer's rank 0, say), the rest from another
  // mesh of the same processes (rollout engines): in processes 1-7, or in
  // 0-4, where process 0 then holds two ranks.
  const bool shared_process = GENERATE(false, true);
  INFO((shared_process ? "process 0 holds a rank of each mesh" : "the meshes' ranks in processes apart"));
  CollectiveCluster c;
  auto other = c.procs.spawn<Reducer>({.max_restarts = -1}).value();
  auto a = c.mesh.flatten("m").range("m", 0, 1).value();
  auto b = other.flatten("m").range("m", shared_process ? 0 : 1, shared_process ? 5 : 8).value();
  const std::vector<troupe::GroupRanks> parts{a.group_ranks(), b.group_ranks()};
  auto groups = troupe::make_group(parts).value();
  REQUIRE(groups.size() == a.size() + b.size());
  auto ranks = members_of(a);
  for (const auto& m : members_of(b)) ranks.push_back(m);
  for (size_t r = 0; r < ranks.size(); ++r) {
    CHECK(groups[r].rank == r);
    REQUIRE(ranks[r].ask(SetGroup{groups[r]}).get().has_value());
  }
  check_every_kind(ranks);

  // A broadcast from rank 0 that the last rank never joins: its process is
  // killed; the others, of both meshes, fail with the reason.
  const size_t last = ranks.size() - 1;
  int64_t victim = ranks[last].ask(MyPid{}).get().value();
  std::vector<troupe::Future<std::vector<double>>> asked;
  for (size_t r = 0; r < last; ++r) {
    asked.push_back(ranks[r].ask(RunAllReduce{1'000'000, static_cast<uint8_t>(DType::float32),
                                              static_cast<uint8_t>(ReduceOp::sum),
                                              static_cast<uint8_t>(troupe::CollectiveKind::broadcast), 0},
                                 60s));
  }
  REQUIRE(::kill(static_cast<pid_t>(victim), SIGKILL) == 0);
  for (size_t r = 0; r < last; ++r) {
    INFO("rank " << r);
    auto got = asked[r].get();
    REQUIRE_FALSE(got.has_value());
    CHECK(got.error().code() == ErrorCode::peer_lost);
    CHECK_THAT(got.error().message(), Catch::Contains("rank " + std::to_string(last)));
  }
  CHECK(troupe::release_group(parts, groups[0]).ok());
  // Bad input: no ranks at all.
  auto none = troupe::make_group(std::vector<troupe::GroupRanks>{});
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().code() == ErrorCode::invalid_argument);
}

TEST_CASE("collectives: ranks on one host go through the arena, or the ring's shared-memory slots, or messages, as "
          "the group says",
          "[cluster][collectives]") {
  CollectiveCluster c;
  // 8 ranks, 64 KiB chunks, 80,000 floats: 40,000-byte segments, one chunk
  // per ring step, 2 x 7 steps per allreduce on every rank.
  const uint64_t steps = 14;
  auto allreduce = [&] {
    auto r = c.mesh.call(RunAllReduce{80'000, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum)});
    INFO((r.ok() ? std::string("ok") : r.errors()[0].second.to_string()));
    REQUIRE(r.ok());
    for (size_t i = 0; i < 80'000; i += 997) CHECK((*r[5])[i] == expected(DType::float32, ReduceOp::sum, 8, i));
  };
  auto counts = [&] { return c.mesh.call(ChunkCounts{}); };

  // The default: every collective through the arena, no ring chunks.
  c.give_groups(c.mesh);
  allreduce();
  allreduce();
  auto arena = counts();
  REQUIRE(arena.ok());
  for (size_t m = 0; m < 8; ++m) {
    INFO("member " << m);
    CHECK((*arena[m])[0] == 0);
    CHECK((*arena[m])[1] == 0);
    CHECK((*arena[m])[3] == 2);
  }

  c.give_groups(c.mesh, troupe::GroupOptions{.host_arena = false, .chunk_bytes = 64 << 10});
  allreduce();
  allreduce();
  auto shm = counts();
  REQUIRE(shm.ok());
  for (size_t m = 0; m < 8; ++m) {
    INFO("member " << m);
    // All of them once the next rank has mapped the slots it was offered
    // (at most the first allreduce's chunks can go before that).
    CHECK((*shm[m])[0] + (*shm[m])[1] == 2 * steps);
    CHECK((*shm[m])[0] >= steps);
    // In the second allreduce at least, reduce-scatter steps 0 to 5 went
    // straight on into the next rank's slot (the 7th is this rank's own).
    CHECK((*shm[m])[2] >= 6);
    CHECK((*shm[m])[3] == 0);
  }

  c.give_groups(c.mesh, troupe::GroupOptions{.shared_memory = false});
  allreduce();
  auto messages = counts();
  REQUIRE(messages.ok());
  for (size_t m = 0; m < 8; ++m) {
    INFO("member " << m);
    CHECK((*messages[m])[0] == 0);
    CHECK((*messages[m])[1] == steps);
    CHECK((*messages[m])[2] == 0);
    CHECK((*messages[m])[3] == 0);
  }
}

TEST_CASE("collectives: reduce_scatter, allgather, broadcast and barrier across 8 processes", "[cluster][collectives]") {
  CollectiveCluster c;
  c.give_groups(c.mesh);
  auto run = [&](troupe::CollectiveKind kind, size_t count, uint32_t root = 0) {
    return c.mesh.call(RunAllReduce{count, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum),
                                    static_cast<uint8_t>(kind), root},
                       60s);
  };
  for (size_t count : {size_t{0}, size_t{5}, size_t{1001}, size_t{300'001}}) {
    INFO("count " << count);
    auto rs = run(troupe::CollectiveKind::reduce_scatter, count);
    REQUIRE(rs.ok());
    for (uint32_t r = 0; r < 8; ++r) {
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        if (owner_of(i, count, 8) == r) wrong += (*rs[r])[i] != expected(DType::float32, ReduceOp::sum, 8, i);
      }
      CHECK(wrong == 0);
    }
    auto ag = run(troupe::CollectiveKind::allgather, count);
    REQUIRE(ag.ok());
    for (uint32_t r = 0; r < 8; ++r) {
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) wrong += (*ag[r])[i] != pattern(owner_of(i, count, 8), i);
      CHECK(wrong == 0);
    }
    for (uint32_t root : {0u, 3u, 7u}) {
      auto bc = run(troupe::CollectiveKind::broadcast, count, root);
      REQUIRE(bc.ok());
      for (uint32_t r = 0; r < 8; ++r) {
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) wrong += (*bc[r])[i] != pattern(root, i);
        CHECK(wrong == 0);
      }
    }
  }
  CHECK(run(troupe::CollectiveKind::barrier, 0).ok());
  auto bad_root = run(troupe::CollectiveKind::broadcast, 4, 8);
  REQUIRE_FALSE(bad_root.ok());
  CHECK_THAT(bad_root.errors()[0].second.message(), Catch::Contains("root 8"));
}

TEST_CASE("collectives: ranks that disagree on a collective all fail with a clear error, at once", "[cluster][collectives]") {
  CollectiveCluster c;
  c.give_groups(c.mesh, 60s);
  // Rank 3 asks for a different size: a programming error on one rank.
  RunAllReduce bad{1000, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum), 0, 0, 3, 999};
  // `broadcast_done`: the others' call is a broadcast, whose root (and
  // ranks up the tree) may be done before the disagreement is found,
  // having sent, or received and passed on, every chunk: they hold the
  // root's buffer.
  auto all_disagree = [&](const RunAllReduce& m, bool broadcast_done = false,
                          const troupe::ActorMesh<Reducer>* view = nullptr) {
    auto r = (view != nullptr ? *view : c.mesh).call(m, 30s);
    REQUIRE(r.size() == (view != nullptr ? view->size() : 8));
    for (size_t i = 0; i < r.size(); ++i) {
      if (r[i].has_value()) {
        INFO("rank " << i << " succeeded");
        REQUIRE(broadcast_done);
        CHECK(i != m.odd_rank);
        size_t wrong = 0;
        for (size_t k = 0; k < m.count; ++k) wrong += (*r[i])[k] != pattern(m.root, k);
        CHECK(wrong == 0);
        continue;
      }
      // Not the group's 60 s deadline: the rank that noticed told the others.
      const troupe::Status& why = r[i].error();
      INFO("rank " << i << ": " << why.to_string());
      CHECK(why.code() == ErrorCode::invalid_argument);
      CHECK_THAT(why.message(), Catch::Contains("disagree"));
    }
  };
  all_disagree(bad);
  // Between the engines, by message (4 KiB chunks: 40 of them for the
  // others' broadcast): rank 7 calls an allreduce instead. Its sender's
  // chunks are checked as they come, whether it called yet or not.
  c.give_groups(c.mesh, troupe::GroupOptions{.timeout = 60s, .shared_memory = false, .host_arena = false,
                                             .chunk_bytes = 4096});
  RunAllReduce broadcast{40'000, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum),
                         static_cast<uint8_t>(troupe::CollectiveKind::broadcast), 0, 7, 40'000};
  broadcast.odd_kind = static_cast<uint8_t>(troupe::CollectiveKind::allreduce);
  all_disagree(broadcast, true);
  c.give_groups(c.mesh, troupe::GroupOptions{.timeout = 60s, .shared_memory = false, .host_arena = false,
                                             .chunk_bytes = 4096});
  // On 7 ranks, rank 6 broadcasts fewer elements: one chunk, which it
  // expects down the binomial tree from rank 4, while the others' 40 go
  // down the chain, where rank 5 sends to it. The chunks it would never
  // have read are checked all the same.
  auto seven = c.mesh.flatten("members").range("members", 0, 7).value();
  c.give_groups(seven, troupe::GroupOptions{.timeout = 60s, .shared_memory = false, .host_arena = false,
                                            .chunk_bytes = 4096});
  REQUIRE(troupe::collectives::broadcast_tree(7, 0, 6, 1).parent == 4u);
  REQUIRE(troupe::collectives::broadcast_tree(7, 0, 6, 40).parent == 5u);
  broadcast.odd_kind = 255;
  broadcast.odd_rank = 6;
  broadcast.odd_count = 1000;
  all_disagree(broadcast, true, &seven);
}

TEST_CASE("collectives: a released group fails its collectives in progress and later ones, and frees its shared "
          "memory in every process",
          "[cluster][collectives]") {
  CollectiveCluster c;
  std::vector<int64_t> pids;
  for (size_t m = 0; m < 8; ++m) pids.push_back(c.mesh.member(m).ask(MyPid{}).get().value());
  auto groups = c.mesh.make_group().value();
  for (size_t i = 0; i < 8; ++i) REQUIRE(c.mesh.member(i).ask(SetGroup{groups[i]}).get().has_value());
  REQUIRE(c.mesh.call(RunAllReduce{1000, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum)}).ok());
  for (size_t m = 0; m < 8; ++m) CHECK(shared_mappings(pids[m]) > 0);

  // Seven members start an allreduce the eighth never joins; the driver
  // releases the group: they fail at once, with the reason.
  auto seven = c.mesh.flatten("members").range("members", 0, 7).value();
  auto stream = seven.stream(RunAllReduce{100'000, static_cast<uint8_t>(DType::float32),
                                          static_cast<uint8_t>(ReduceOp::sum)},
                             60s);
  // Whether a member's call reaches its engine before or after the
  // release, it fails with not_found.
  REQUIRE(c.mesh.release_group(groups[0]).ok());
  size_t failed = 0;
  while (auto reply = stream.next()) {
    REQUIRE_FALSE(reply->second.has_value());
    CHECK(reply->second.error().code() == ErrorCode::not_found);
    ++failed;
  }
  CHECK(failed == 7);
  // Later collectives on it fail; nothing of it is left mapped anywhere.
  auto later = c.mesh.call(RunAllReduce{10, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum)});
  REQUIRE(later.errors().size() == 8);
  CHECK(later.errors()[0].second.code() == ErrorCode::not_found);
  for (size_t m = 0; m < 8; ++m) {
    INFO("member " << m);
    CHECK(shared_mappings(pids[m]) == 0);
  }
  // Releasing again is harmless; a ring group's slots go the same way.
  CHECK(c.mesh.release_group(groups[0]).ok());
  auto ring = c.mesh.make_group(troupe::GroupOptions{.host_arena = false}).value();
  for (size_t i = 0; i < 8; ++i) REQUIRE(c.mesh.member(i).ask(SetGroup{ring[i]}).get().has_value());
  REQUIRE(c.mesh.call(RunAllReduce{1000, static_cast<uint8_t>(DType::float32), static_cast<uint8_t>(ReduceOp::sum)}).ok());
  for (size_t m = 0; m < 8; ++m) CHECK(shared_mappings(pids[m]) > 0);
  REQUIRE(c.mesh.release_group(ring[0]).ok());
  for (size_t m = 0; m < 8; ++m) CHECK(shared_mappings(pids[m]) == 0);
}

TEST_CASE("collectives: members' CollectiveBuffers are read in place by the other processes of their host (and "
          "written in place by an allreduce when all are) with every kind matching the reference beside ordinary "
          "buffers",
          "[cluster][collectives][in_place]") {
  // One host (one arena of 8), and two (arenas of 4, rings between them).
  const bool two_hosts = GENERATE(false, true);
  INFO((two_hosts ? "two hosts" : "one host"));
  auto cluster = two_hosts ? std::make_unique<CollectiveCluster>(std::vector<std::string>{"host-a", "host-b"})
                           : std::make_unique<CollectiveCluster>();
  CollectiveCluster& c = *cluster;
  c.give_groups(c.mesh);
  // Every rank's buffer shared; then only the odd ranks'.
  for (uint64_t registered : {uint64_t{0xff}, uint64_t{0xaa}}) {
    INFO("registered ranks 0x" << std::hex << registered);
    auto before = c.mesh.call(ChunkCounts{});
    REQUIRE(before.ok());
    check_every_kind(c.mesh, registered);
    auto after = c.mesh.call(ChunkCounts{});
    REQUIRE(after.ok());
    for (size_t m = 0; m < 8; ++m) {
      INFO("member " << m);
      // Past 64 KiB (kInPlaceMinBytes), every collective but the barrier
      // read some rank's buffer in place: the 300,001-, 100,003-, 70,001- and
      // 50,000-element ones (an allreduce over two hosts has two arena
      // stages, a reduce_scatter one, and an allgather one).
      uint64_t in_place = (*after[m])[7] - (*before[m])[7];
      CHECK(in_place == (two_hosts ? 5u : 4u));
      // With every buffer shared, the one-host allreduce past 64 KiB was
      // written in place (the two-host one's arena stages are a
      // reduce_scatter and an allgather, which read in place).
      uint64_t written = (*after[m])[8] - (*before[m])[8];
      CHECK(written == (registered == 0xff && !two_hosts ? 1u : 0u));
    }
  }
}
