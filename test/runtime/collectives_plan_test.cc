// The plans of collectives on groups spread over hosts (collectives/hierarchy.h),
// run by an emulator in one process: each arena stage is done for a host's
// ranks once all of them have reached it, each net stage for its members
// once all of them have, with reference semantics for every kind. Elements a
// stage leaves unspecified are poisoned, so a plan that reads them fails.
// Every layout must give every rank the collective's result, with no rank
// left waiting for a stage the others never run.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "collectives/hierarchy.h"

using troupe::CollectiveKind;
using troupe::ReduceOp;
using namespace troupe::collectives;

namespace {

constexpr double kPoison = -12345.5;

double combine(ReduceOp op, double a, double b) {
  if (op == ReduceOp::max) return std::max(a, b);
  if (op == ReduceOp::min) return std::min(a, b);
  return a + b;
}

double pattern(uint32_t rank, size_t i) { return static_cast<double>((rank + 1) * 7 + static_cast<int>(i % 13)); }

/// Runs one collective of `kind` among `ranks` buffers (each holding the
/// stage's elements only): the reference semantics of a stage, with
/// `segments[k]` what ranks[k] owns. `root`: an index into `ranks`.
void apply(CollectiveKind kind, ReduceOp op, uint32_t root, const std::vector<ElemRange>& segments, size_t divide_by,
           std::vector<std::vector<double>>& ranks) {
  size_t n = ranks.size(), len = ranks[0].size();
  auto owns = [&](size_t k, size_t at) {
    return at >= segments[k].offset_elems && at < segments[k].offset_elems + segments[k].len_elems;
  };
  switch (kind) {
    case CollectiveKind::allreduce:
    case CollectiveKind::reduce_scatter: {
      std::vector<double> acc = ranks[0];
      for (size_t k = 1; k < n; ++k) {
        for (size_t i = 0; i < len; ++i) acc[i] = combine(op, acc[i], ranks[k][i]);
      }
      if (op == ReduceOp::avg) {
        for (double& v : acc) v /= static_cast<double>(divide_by);
      }
      for (size_t k = 0; k < n; ++k) {
        for (size_t i = 0; i < len; ++i) {
          ranks[k][i] = kind == CollectiveKind::allreduce || owns(k, i) ? acc[i] : kPoison;
        }
      }
      break;
    }
    case CollectiveKind::allgather:
      for (size_t k = 0; k < n; ++k) {
        for (size_t j = 0; j < n; ++j) {
          if (j == k) continue;
          std::copy_n(ranks[k].begin() + segments[k].offset_elems, segments[k].len_elems,
                      ranks[j].begin() + segments[k].offset_elems);
        }
      }
      break;
    case CollectiveKind::broadcast:
      for (size_t j = 0; j < n; ++j) {
        if (j != root) ranks[j] = ranks[root];
      }
      break;
    case CollectiveKind::barrier:
      break;
  }
}

/// The elements of `runs` of `buffer`, concatenated.
std::vector<double> gather(const std::vector<double>& buffer, const std::vector<ElemRange>& runs) {
  std::vector<double> out;
  for (const ElemRange& run : runs) {
    out.insert(out.end(), buffer.begin() + run.offset_elems, buffer.begin() + run.offset_elems + run.len_elems);
  }
  return out;
}

/// gather()'s inverse: `elems` back into `runs` of `buffer`.
void scatter(const std::vector<double>& elems, const std::vector<ElemRange>& runs, std::vector<double>& buffer) {
  size_t at = 0;
  for (const ElemRange& run : runs) {
    std::copy_n(elems.begin() + at, run.len_elems, buffer.begin() + run.offset_elems);
    at += run.len_elems;
  }
}

/// Runs a stage of `kind` on `members`' buffers: on the concatenation of
/// `runs`, member k owning `segments[k]` of it.
void run_stage(const Stage& s, ReduceOp op, const std::vector<ElemRange>& runs, const std::vector<ElemRange>& segments,
               size_t divide_by, const std::vector<uint32_t>& members, std::vector<std::vector<double>>& buffers) {
  std::vector<std::vector<double>> views;
  for (uint32_t m : members) views.push_back(gather(buffers[m], runs));
  apply(s.kind, op, s.root, segments, divide_by, views);
  for (size_t k = 0; k < members.size(); ++k) scatter(views[k], runs, buffers[members[k]]);
}

struct Emulated {
  std::vector<std::vector<double>> buffers;
  bool all_done = false;
  std::vector<std::string> mismatched_stages;
};

/// Runs every rank's plan to the end (or until no stage can run).
Emulated emulate(const GroupLayout& layout, CollectiveKind kind, size_t count, ReduceOp op, uint32_t root,
                 std::vector<std::vector<double>> buffers) {
  uint32_t n = layout.ranks();
  std::vector<CollectivePlan> plans;
  std::vector<size_t> next(n, 0);
  for (uint32_t r = 0; r < n; ++r) plans.push_back(plan_collective(layout, r, kind, count, op, root));
  Emulated out;
  auto at = [&](uint32_t r) -> const Stage* { return next[r] < plans[r].stages.size() ? &plans[r].stages[next[r]] : nullptr; };
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (uint32_t h = 0; h < layout.hosts(); ++h) {
      const auto& local = layout.ranks_on(h);
      bool ready = std::all_of(local.begin(), local.end(), [&](uint32_t r) {
        return at(r) != nullptr && at(r)->where == StageWhere::arena;
      });
      if (!ready) continue;
      const CollectivePlan& first = plans[local[0]];
      for (uint32_t r : local) {
        if (!(*at(r) == *at(local[0])) || plans[r].arena_op != first.arena_op ||
            plans[r].arena_segments != first.arena_segments) {
          out.mismatched_stages.push_back("arena of host " + std::to_string(h));
        }
      }
      // The arena's elements: its segments one after another (the
      // default: the whole buffer, cut over the host's ranks).
      std::vector<ElemRange> runs{ElemRange{0, count}}, segments;
      if (first.arena_segments.empty()) {
        for (size_t k = 0; k < local.size(); ++k) segments.push_back(ring_segment(count, local.size(), k));
      } else {
        if (first.arena_segments.size() != local.size()) out.mismatched_stages.push_back("arena segments");
        runs.clear();
        size_t seen = 0;
        for (const auto& own : first.arena_segments) {
          size_t len = 0;
          for (const ElemRange& run : own) {
            runs.push_back(run);
            len += run.len_elems;
          }
          segments.push_back(ElemRange{seen, len});
          seen += len;
        }
        // Together they are the whole buffer, each element once.
        std::vector<int> covered(count, 0);
        for (const ElemRange& run : runs) {
          for (size_t i = 0; i < run.len_elems; ++i) ++covered[run.offset_elems + i];
        }
        if (std::any_of(covered.begin(), covered.end(), [](int c) { return c != 1; })) {
          out.mismatched_stages.push_back("arena segments of host " + std::to_string(h) + " do not tile the buffer");
        }
      }
      run_stage(*at(local[0]), first.arena_op, runs, segments, local.size(), local, buffers);
      for (uint32_t r : local) ++next[r];
      progressed = true;
    }
    for (uint32_t r = 0; r < n; ++r) {
      if (at(r) == nullptr || at(r)->where != StageWhere::net) continue;
      const NetPart& part = plans[r].net;
      if (part.index != 0) continue;  // run once, by its first member
      bool ready = std::all_of(part.members.begin(), part.members.end(), [&](uint32_t m) {
        return at(m) != nullptr && at(m)->where == StageWhere::net;
      });
      if (!ready) continue;
      for (uint32_t k = 0; k < part.members.size(); ++k) {
        uint32_t m = part.members[k];
        const NetPart& theirs = plans[m].net;
        if (!(*at(m) == *at(r)) || theirs.members != part.members || theirs.index != k || theirs.runs != part.runs) {
          out.mismatched_stages.push_back("net stage of rank " + std::to_string(m));
        }
      }
      // The engine's ring cuts its segments from the runs' concatenation
      // and maps each back to the buffer (NetPart::to_buffer): the
      // emulator does the same, so segments straddling runs would fail.
      std::vector<ElemRange> segments;
      for (size_t k = 0; k < part.members.size(); ++k) {
        ElemRange seg = ring_segment(part.len_elems(), part.members.size(), k);
        if (part.runs.size() > 1 && (part.runs.size() != part.members.size() || seg.len_elems != part.runs[k].len_elems)) {
          out.mismatched_stages.push_back("net segment " + std::to_string(k) + " is not its member's run");
        }
        segments.push_back(seg);
      }
      run_stage(*at(r), plans[r].arena_op, part.runs, segments, n, part.members, buffers);
      for (uint32_t m : part.members) {
        if (auto avg = plans[m].average) {
          for (size_t i = 0; i < avg->len_elems; ++i) buffers[m][avg->offset_elems + i] /= static_cast<double>(n);
        }
        ++next[m];
      }
      progressed = true;
    }
  }
  out.all_done = true;
  for (uint32_t r = 0; r < n; ++r) out.all_done = out.all_done && at(r) == nullptr;
  out.buffers = std::move(buffers);
  return out;
}

std::string describe(const GroupLayout& layout) {
  std::string s = "hosts of ranks:";
  for (uint32_t r = 0; r < layout.ranks(); ++r) s += " " + std::to_string(layout.host_of(r));
  return s;
}

}  // namespace

TEST_CASE("collective plans give every rank the collective's result on any layout of ranks over hosts",
          "[collectives][plan]") {
  std::vector<GroupLayout> layouts{GroupLayout::flat(1), GroupLayout::flat(2), GroupLayout::flat(5)};
  for (const std::vector<uint32_t>& hosts : std::vector<std::vector<uint32_t>>{
           {0, 0, 0, 0}, {0, 0, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}, {0, 1, 0, 1, 0, 1}, {0, 0, 0, 1},
           {7, 3, 3, 9, 9, 9}, {0, 1, 1, 1, 1, 2}, {5, 5, 5, 6, 6, 6, 4, 4, 4}, {0, 0, 1, 1, 1, 0},
           {1, 0, 0, 1}}) {
    layouts.push_back(GroupLayout::make(hosts).value());
  }
  const CollectiveKind kinds[] = {CollectiveKind::allreduce, CollectiveKind::reduce_scatter, CollectiveKind::allgather,
                                  CollectiveKind::broadcast, CollectiveKind::barrier};
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
  for (const GroupLayout& layout : layouts) {
    uint32_t n = layout.ranks();
    for (CollectiveKind kind : kinds) {
      for (ReduceOp op : ops) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{64}, size_t{1001}}) {
          for (uint32_t root : {0u, n / 2, n - 1}) {
            INFO(describe(layout) << ", kind " << static_cast<int>(kind) << ", op " << static_cast<int>(op)
                                  << ", count " << count << ", root " << root);
            std::vector<std::vector<double>> in(n, std::vector<double>(count, kPoison));
            for (uint32_t r = 0; r < n; ++r) {
              for (size_t i = 0; i < count; ++i) {
                ElemRange own = ring_segment(count, n, r);
                bool gives = kind == CollectiveKind::allgather
                                 ? (i >= own.offset_elems && i < own.offset_elems + own.len_elems)
                                 : kind != CollectiveKind::broadcast || r == root;
                if (gives) in[r][i] = pattern(r, i);
              }
            }
            Emulated got = emulate(layout, kind, count, op, root, in);
            REQUIRE(got.mismatched_stages.empty());
            REQUIRE(got.all_done);
            for (uint32_t r = 0; r < n; ++r) {
              ElemRange own = ring_segment(count, n, r);
              for (size_t i = 0; i < count; ++i) {
                double want = 0;
                switch (kind) {
                  case CollectiveKind::allreduce:
                  case CollectiveKind::reduce_scatter:
                    want = pattern(0, i);
                    for (uint32_t k = 1; k < n; ++k) want = combine(op, want, pattern(k, i));
                    if (op == ReduceOp::avg) want /= n;
                    if (kind == CollectiveKind::reduce_scatter &&
                        (i < own.offset_elems || i >= own.offset_elems + own.len_elems)) {
                      continue;  // unspecified
                    }
                    break;
                  case CollectiveKind::allgather: {
                    uint32_t owner = 0;
                    while (!(i < ring_segment(count, n, owner).offset_elems + ring_segment(count, n, owner).len_elems)) ++owner;
                    want = pattern(owner, i);
                    break;
                  }
                  case CollectiveKind::broadcast:
                    want = pattern(root, i);
                    break;
                  case CollectiveKind::barrier:
                    want = in[r][i];
                    break;
                }
                INFO("rank " << r << ", element " << i);
                REQUIRE(got.buffers[r][i] == want);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("collective plans: a flat layout is one ring or tree over all ranks, one host is one arena stage",
          "[collectives][plan]") {
  GroupLayout flat = GroupLayout::flat(4);
  CollectivePlan ring = plan_collective(flat, 2, CollectiveKind::allreduce, 100, ReduceOp::avg, 0);
  REQUIRE(ring.stages.size() == 1);
  CHECK(ring.stages[0].where == StageWhere::net);
  CHECK(ring.net.members == std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(ring.net.index == 2);
  CHECK(ring.net.runs == std::vector<ElemRange>{ElemRange{0, 100}});
  REQUIRE(ring.average.has_value());
  CHECK(*ring.average == ElemRange{0, 100});

  GroupLayout one = GroupLayout::make({3, 3, 3}).value();
  CollectivePlan arena = plan_collective(one, 1, CollectiveKind::allreduce, 100, ReduceOp::avg, 0);
  REQUIRE(arena.stages.size() == 1);
  CHECK(arena.stages[0].where == StageWhere::arena);
  CHECK(arena.arena_op == ReduceOp::avg);  // the single arena averages by itself
  CHECK_FALSE(arena.average.has_value());
}

TEST_CASE("collective plans: an allreduce over two hosts of four ranks runs four two-rank rings side by side",
          "[collectives][plan]") {
  GroupLayout layout = GroupLayout::make({0, 0, 0, 0, 1, 1, 1, 1}).value();
  CHECK(layout.uniform());
  for (uint32_t r = 0; r < 8; ++r) {
    CollectivePlan p = plan_collective(layout, r, CollectiveKind::allreduce, 4000, ReduceOp::sum, 0);
    REQUIRE(p.stages.size() == 3);
    CHECK(p.stages[0] == Stage{StageWhere::arena, CollectiveKind::reduce_scatter, 0});
    CHECK(p.stages[1] == Stage{StageWhere::net, CollectiveKind::allreduce, 0});
    CHECK(p.stages[2] == Stage{StageWhere::arena, CollectiveKind::allgather, 0});
    CHECK(p.net.members == std::vector<uint32_t>{r % 4, r % 4 + 4});
    CHECK(p.net.runs == std::vector<ElemRange>{ElemRange{1000 * (r % 4), 1000}});
  }
  // Uneven hosts: only the leaders cross.
  GroupLayout uneven = GroupLayout::make({0, 0, 0, 1}).value();
  CHECK_FALSE(uneven.uniform());
  CHECK(plan_collective(uneven, 1, CollectiveKind::allreduce, 10, ReduceOp::sum, 0).stages.size() == 2);
  CHECK(plan_collective(uneven, 0, CollectiveKind::allreduce, 10, ReduceOp::sum, 0).net.members ==
        std::vector<uint32_t>{0, 3});
}

TEST_CASE("collective plans: reduce_scatter and allgather over two hosts of four ranks run by columns on the ranks' own segments",
          "[collectives][plan]") {
  GroupLayout layout = GroupLayout::make({0, 0, 0, 0, 1, 1, 1, 1}).value();
  // 8003 elements over 8 ranks: segments of 1001 (ranks 0-2) and 1000.
  std::vector<std::vector<ElemRange>> columns;
  for (uint32_t i = 0; i < 4; ++i) columns.push_back({ring_segment(8003, 8, i), ring_segment(8003, 8, i + 4)});
  for (uint32_t r = 0; r < 8; ++r) {
    CollectivePlan rs = plan_collective(layout, r, CollectiveKind::reduce_scatter, 8003, ReduceOp::avg, 0);
    REQUIRE(rs.stages.size() == 2);
    CHECK(rs.stages[0] == Stage{StageWhere::arena, CollectiveKind::reduce_scatter, 0});
    CHECK(rs.stages[1] == Stage{StageWhere::net, CollectiveKind::reduce_scatter, 0});
    CHECK(rs.net.members == std::vector<uint32_t>{r % 4, r % 4 + 4});
    CHECK(rs.net.index == r / 4);
    CHECK(rs.net.runs == columns[r % 4]);
    CHECK(rs.arena_segments == columns);
    REQUIRE(rs.average.has_value());
    CHECK(*rs.average == ring_segment(8003, 8, r));  // its own segment, once the ring is done

    CollectivePlan ag = plan_collective(layout, r, CollectiveKind::allgather, 8003, ReduceOp::sum, 0);
    REQUIRE(ag.stages.size() == 2);
    CHECK(ag.stages[0] == Stage{StageWhere::net, CollectiveKind::allgather, 0});
    CHECK(ag.stages[1] == Stage{StageWhere::arena, CollectiveKind::allgather, 0});
    CHECK(ag.net.runs == columns[r % 4]);
    CHECK(ag.arena_segments == columns);
  }
  // A ring's segments of the concatenation are its members' own segments:
  // the runs map back exactly.
  CollectivePlan p = plan_collective(layout, 5, CollectiveKind::allgather, 8003, ReduceOp::sum, 0);
  CHECK(p.net.len_elems() == 2001);
  CHECK(p.net.to_buffer(ring_segment(2001, 2, 0)) == ring_segment(8003, 8, 1));
  CHECK(p.net.to_buffer(ring_segment(2001, 2, 1)) == ring_segment(8003, 8, 5));
  CHECK(p.net.to_buffer(ElemRange{1001 + 10, 20}) == ElemRange{ring_segment(8003, 8, 5).offset_elems + 10, 20});
  // Uneven hosts keep the leaders' allreduce and the flat ring.
  GroupLayout uneven = GroupLayout::make({0, 0, 0, 1}).value();
  CHECK(plan_collective(uneven, 1, CollectiveKind::allgather, 10, ReduceOp::sum, 0).net.members ==
        std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(plan_collective(uneven, 1, CollectiveKind::reduce_scatter, 10, ReduceOp::sum, 0).stages ==
        plan_collective(uneven, 1, CollectiveKind::allreduce, 10, ReduceOp::sum, 0).stages);
}

TEST_CASE("group layouts number hosts by their first rank and reject no ranks", "[collectives][plan]") {
  GroupLayout l = GroupLayout::make({9, 4, 9, 4, 1}).value();
  CHECK(l.hosts() == 3);
  CHECK(l.host_numbers() == std::vector<uint32_t>{0, 1, 0, 1, 2});
  CHECK(l.local_index(2) == 1);
  CHECK(l.ranks_on(1) == std::vector<uint32_t>{1, 3});
  auto empty = GroupLayout::make({});
  REQUIRE_FALSE(empty.has_value());
  CHECK(empty.error().code() == troupe::ErrorCode::invalid_argument);
}
