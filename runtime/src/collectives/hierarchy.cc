#include "collectives/hierarchy.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

namespace troupe::collectives {

GroupLayout GroupLayout::flat(uint32_t ranks) {
  GroupLayout l;
  for (uint32_t r = 0; r < ranks; ++r) {
    l.host_of_.push_back(r);
    l.local_index_.push_back(0);
    l.ranks_on_.push_back({r});
  }
  return l;
}

Result<GroupLayout> GroupLayout::make(const std::vector<uint32_t>& host_of_rank) {
  if (host_of_rank.empty()) return error(ErrorCode::invalid_argument, "collectives: a group layout of no ranks");
  GroupLayout l;
  std::map<uint32_t, uint32_t> number;  // label -> host number, by first rank
  for (uint32_t r = 0; r < host_of_rank.size(); ++r) {
    auto [it, fresh] = number.try_emplace(host_of_rank[r], static_cast<uint32_t>(l.ranks_on_.size()));
    if (fresh) l.ranks_on_.emplace_back();
    l.host_of_.push_back(it->second);
    l.local_index_.push_back(static_cast<uint32_t>(l.ranks_on_[it->second].size()));
    l.ranks_on_[it->second].push_back(r);
  }
  return l;
}

bool GroupLayout::uniform() const {
  return std::all_of(ranks_on_.begin(), ranks_on_.end(),
                     [&](const auto& on) { return on.size() == ranks_on_.front().size(); });
}

size_t NetPart::len_elems() const {
  size_t len = 0;
  for (const ElemRange& run : runs) len += run.len_elems;
  return len;
}

ElemRange NetPart::to_buffer(ElemRange in_runs) const {
  if (in_runs.len_elems == 0) return ElemRange{runs.empty() ? 0 : runs.front().offset_elems, 0};
  size_t at = 0;
  for (const ElemRange& run : runs) {
    if (in_runs.offset_elems < at + run.len_elems) {
      if (in_runs.offset_elems + in_runs.len_elems > at + run.len_elems) break;
      return ElemRange{run.offset_elems + (in_runs.offset_elems - at), in_runs.len_elems};
    }
    at += run.len_elems;
  }
  // A plan whose ring segments straddle its runs would move the wrong
  // elements: a bug in this file, never an input.
  std::fprintf(stderr, "troupe: collectives plan: elements %zu+%zu straddle the net stage's runs\n",
               in_runs.offset_elems, in_runs.len_elems);
  std::abort();
}

namespace {

/// The ranks with local index `column` on every host, in host order.
std::vector<uint32_t> column(const GroupLayout& layout, uint32_t column) {
  std::vector<uint32_t> members;
  for (uint32_t h = 0; h < layout.hosts(); ++h) members.push_back(layout.ranks_on(h)[column]);
  return members;
}

/// The same, in rank order: the members of a ring over their own segments
/// (ring segments of their segments' concatenation are then exactly those:
/// the longer segments are the lower ranks').
std::vector<uint32_t> column_by_rank(const GroupLayout& layout, uint32_t index) {
  std::vector<uint32_t> members = column(layout, index);
  std::sort(members.begin(), members.end());
  return members;
}

/// The segments `members` own of a buffer of `count` elements cut over
/// all `ranks` ranks of the group, in members' order.
std::vector<ElemRange> segments_of(size_t count, uint32_t ranks, const std::vector<uint32_t>& members) {
  std::vector<ElemRange> runs;
  for (uint32_t m : members) runs.push_back(ring_segment(count, ranks, m));
  return runs;
}

uint32_t index_in(const std::vector<uint32_t>& members, uint32_t rank) {
  return static_cast<uint32_t>(std::find(members.begin(), members.end(), rank) - members.begin());
}

/// reduce_scatter (true) or allgather (false) on uniform hosts of two ranks
/// or more each: by columns, on the ranks' own segments.
void plan_by_columns(const GroupLayout& layout, uint32_t rank, size_t count, bool reduce, CollectivePlan& plan) {
  std::vector<uint32_t> members = column_by_rank(layout, layout.local_index(rank));
  plan.net = NetPart{members, index_in(members, rank), segments_of(count, layout.ranks(), members)};
  for (uint32_t i = 0; i < layout.ranks_on(0).size(); ++i) {
    plan.arena_segments.push_back(segments_of(count, layout.ranks(), column_by_rank(layout, i)));
  }
  Stage arena{StageWhere::arena, reduce ? CollectiveKind::reduce_scatter : CollectiveKind::allgather, 0};
  Stage net{StageWhere::net, arena.kind, 0};
  plan.stages = reduce ? std::vector<Stage>{arena, net} : std::vector<Stage>{net, arena};
}

Stage arena(CollectiveKind kind, uint32_t root = 0) { return Stage{StageWhere::arena, kind, root}; }
Stage net(CollectiveKind kind, uint32_t root = 0) { return Stage{StageWhere::net, kind, root}; }

/// allreduce (and reduce_scatter, which gets a superset of its result) on
/// more than one host.
void plan_allreduce(const GroupLayout& layout, uint32_t rank, size_t count, ReduceOp op, CollectivePlan& plan) {
  uint32_t host = layout.host_of(rank), local = layout.local_index(rank);
  bool shared = layout.ranks_on(host).size() > 1;
  if (layout.uniform()) {
    // Columns: local reduce_scatter, a ring per local index, local allgather.
    size_t per_host = layout.ranks_on(0).size();
    plan.net = NetPart{column(layout, local), host, {ring_segment(count, per_host, local)}};
    if (shared) plan.stages.push_back(arena(CollectiveKind::reduce_scatter));
    plan.stages.push_back(net(CollectiveKind::allreduce));
    if (shared) plan.stages.push_back(arena(CollectiveKind::allgather));
  } else {
    // Leaders: local allreduce, a ring of the hosts' first ranks over the
    // whole buffer, local broadcast from the leader.
    if (shared) plan.stages.push_back(arena(CollectiveKind::allreduce));
    if (local == 0) {
      plan.net = NetPart{column(layout, 0), host, {ElemRange{0, count}}};
      plan.stages.push_back(net(CollectiveKind::allreduce));
    }
    if (shared) plan.stages.push_back(arena(CollectiveKind::broadcast, 0));
  }
  if (op == ReduceOp::avg && !plan.net.members.empty()) plan.average = plan.net.runs.front();
}

}  // namespace

CollectivePlan plan_collective(const GroupLayout& layout, uint32_t rank, CollectiveKind kind, size_t count_elems,
                               ReduceOp op, uint32_t root) {
  CollectivePlan plan;
  plan.arena_op = op == ReduceOp::avg ? ReduceOp::sum : op;
  uint32_t host = layout.host_of(rank);
  bool shared = layout.ranks_on(host).size() > 1;
  if (layout.hosts() == 1) {
    // One arena does it all (and averages by itself).
    plan.arena_op = op;
    if (shared) plan.stages.push_back(arena(kind, layout.local_index(root)));
    return plan;
  }
  bool flat = layout.hosts() == layout.ranks();
  std::vector<uint32_t> everyone(layout.ranks());
  for (uint32_t r = 0; r < layout.ranks(); ++r) everyone[r] = r;
  switch (kind) {
    case CollectiveKind::allreduce:
      plan_allreduce(layout, rank, count_elems, op, plan);
      break;
    case CollectiveKind::reduce_scatter:
      if (flat) {
        plan.net = NetPart{everyone, rank, {ElemRange{0, count_elems}}};
        plan.stages.push_back(net(CollectiveKind::reduce_scatter));
      } else if (layout.uniform()) {
        plan_by_columns(layout, rank, count_elems, /*reduce=*/true, plan);
      } else {
        plan_allreduce(layout, rank, count_elems, op, plan);
        break;
      }
      if (op == ReduceOp::avg) plan.average = ring_segment(count_elems, layout.ranks(), rank);
      break;
    case CollectiveKind::allgather:
      if (!flat && layout.uniform()) {
        plan_by_columns(layout, rank, count_elems, /*reduce=*/false, plan);
      } else {
        plan.net = NetPart{everyone, rank, {ElemRange{0, count_elems}}};
        plan.stages.push_back(net(CollectiveKind::allgather));
      }
      break;
    case CollectiveKind::broadcast: {
      // A tree among the leaders, the root leading its own host.
      uint32_t root_host = layout.host_of(root);
      std::vector<uint32_t> leaders = column(layout, 0);
      leaders[root_host] = root;
      uint32_t leader = leaders[host];
      if (rank == leader) {
        plan.net = NetPart{leaders, host, {ElemRange{0, count_elems}}};
        plan.stages.push_back(net(CollectiveKind::broadcast, root_host));
      }
      if (shared) plan.stages.push_back(arena(CollectiveKind::broadcast, layout.local_index(leader)));
      break;
    }
    case CollectiveKind::barrier:
      if (shared) plan.stages.push_back(arena(CollectiveKind::barrier));
      if (layout.local_index(rank) == 0) {
        plan.net = NetPart{column(layout, 0), host, {ElemRange{0, 0}}};
        plan.stages.push_back(net(CollectiveKind::barrier));
      }
      if (shared) plan.stages.push_back(arena(CollectiveKind::barrier));
      break;
  }
  return plan;
}

}  // namespace troupe::collectives
