// The placement-group scheduler alone, at scale, without processes: 10,000
// simulated nodes, 100,000 bundles in groups of 8 with mixed strategies
// (STRICT_PACK, STRICT_SPREAD, PACK, SPREAD, and every tenth group kept inside
// one rack). Reports groups placed per second and the latency per group.
//
// The raw floor, measured in the same run: one linear scan of all nodes'
// free resources for one bundle, the least a scheduler that looks at every
// node pays per decision.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../common/report.h"
#include "placement/ledger.h"

using troupe::bench::emit;
using troupe::bench::quantile;
using troupe::cluster::Ledger;
using Clock = std::chrono::steady_clock;

namespace {

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

troupe::PlacementGroupSpec make_group(size_t i) {
  troupe::PlacementGroupSpec g;
  troupe::ResourceMap each;
  switch (i % 4) {
    case 0:  // a trainer: one whole 8-GPU node
      g.strategy = troupe::PlacementStrategy::strict_pack;
      each = {{"GPU", 1}, {"CPU", 4}};
      break;
    case 1:  // rollout workers on 8 distinct nodes
      g.strategy = troupe::PlacementStrategy::strict_spread;
      each = {{"CPU", 8}};
      break;
    case 2:
      g.strategy = troupe::PlacementStrategy::pack;
      each = {{"CPU", 2}};
      break;
    default:
      g.strategy = troupe::PlacementStrategy::spread;
      each = {{"CPU", 1}, {"memory", 8e9}};
      break;
  }
  if (i % 10 == 9) {
    g.strategy = troupe::PlacementStrategy::strict_spread;
    g.same_label = "rack";
    each = {{"CPU", 4}};
  }
  g.bundles.assign(8, troupe::Bundle{each});
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = troupe::bench::quick(argc, argv);
  const size_t nodes = quick ? 1000 : 10'000;
  const size_t groups = quick ? 1250 : 12'500;  // x 8 bundles
  Ledger ledger;
  for (size_t i = 0; i < nodes; ++i) {
    ledger.add_node("node-" + std::to_string(i), {{"CPU", 64}, {"GPU", 8}, {"memory", 512e9}},
                    {{"rack", "r" + std::to_string(i / 32)}, {"zone", "z" + std::to_string(i % 4)}});
  }

  // The floor: one scan of every node for a bundle that fits none.
  troupe::Bundle probe{{{"CPU", 1e9}}};
  std::vector<double> scan_us;
  for (int r = 0; r < 200; ++r) {
    auto t0 = Clock::now();
    size_t fits = 0;
    for (size_t n = 0; n < ledger.node_count(); ++n) {
      const auto& node = ledger.node(static_cast<troupe::cluster::NodeIndex>(n));
      fits += node.alive && !node.free.empty() && node.free[0] >= probe.resources.begin()->second;
    }
    scan_us.push_back(us_since(t0));
    if (fits != 0) std::printf("impossible\n");
  }
  double floor_us = quantile(scan_us, 0.5);

  std::vector<double> latency_us;
  latency_us.reserve(groups);
  size_t failed = 0;
  auto t0 = Clock::now();
  for (size_t i = 0; i < groups; ++i) {
    auto spec = make_group(i);
    auto g0 = Clock::now();
    auto out = ledger.place("pg-" + std::to_string(i), spec);
    latency_us.push_back(us_since(g0));
    if (!out.placed) ++failed;
  }
  double secs = us_since(t0) / 1e6;
  if (failed != 0) std::fprintf(stderr, "placement_bench: %zu groups not placed\n", failed);
  std::string base = "one scan of " + std::to_string(nodes) + " nodes' free resources, p50";
  std::string rate_base = "full scans of " + std::to_string(nodes) + " nodes per second";
  double scans_per_s = 1e6 / floor_us;
  std::string name = "placement.scheduler_" + std::to_string(nodes) + "_nodes";
  emit(name, "groups_per_s", static_cast<double>(groups - failed) / secs, "groups/s", rate_base, scans_per_s,
       "report");
  emit(name, "group_latency_p50", quantile(latency_us, 0.5), "us", base, floor_us, "report");
  emit(name, "group_latency_p99", quantile(latency_us, 0.99), "us", base, floor_us, "value <= 10000 us");
  emit(name, "group_latency_max", quantile(latency_us, 1.0), "us", base, floor_us, "report");

  // A rack of nodes dies: every group with a bundle there is rescheduled.
  std::vector<std::string> affected;
  for (size_t n = 0; n < 32; ++n) {
    auto more = ledger.remove_node(static_cast<troupe::cluster::NodeIndex>(n));
    affected.insert(affected.end(), more.begin(), more.end());
  }
  std::vector<double> resched_us;
  for (auto& g : affected) {
    auto r0 = Clock::now();
    (void)ledger.reschedule(g);
    resched_us.push_back(us_since(r0));
  }
  emit(name, "reschedule_p99", quantile(resched_us, 0.99), "us", base, floor_us, "report");

  // And every group is removed.
  auto r0 = Clock::now();
  for (size_t i = 0; i < groups; ++i) ledger.release("pg-" + std::to_string(i));
  emit(name, "removes_per_s", static_cast<double>(groups) / (us_since(r0) / 1e6), "groups/s", rate_base,
       scans_per_s, "report");
  return failed == 0 ? 0 : 1;
}
