// The placement-group scheduler (the head's resource ledger): Ray's four
// strategies, atomic reservation, label selectors, same-label groups, node
// loss and rescheduling, and the reasons a group waits.
#include <algorithm>
#include <map>
#include <set>

#include <catch2/catch.hpp>

#include "placement/ledger.h"

using troupe::Bundle;
using troupe::ErrorCode;
using troupe::PlacementGroupSpec;
using troupe::PlacementStrategy;
using troupe::cluster::kNoNode;
using troupe::cluster::Ledger;
using troupe::cluster::NodeIndex;

namespace {

PlacementGroupSpec group(PlacementStrategy s, int bundles, troupe::ResourceMap each) {
  PlacementGroupSpec spec;
  spec.strategy = s;
  for (int i = 0; i < bundles; ++i) spec.bundles.push_back(Bundle{each});
  return spec;
}

size_t distinct(const std::vector<NodeIndex>& nodes) { return std::set<NodeIndex>(nodes.begin(), nodes.end()).size(); }

/// `count` nodes "n0".."n<count-1>" with `cpus` CPUs each.
Ledger cluster(int count, double cpus, troupe::Labels labels = {}) {
  Ledger l;
  for (int i = 0; i < count; ++i) l.add_node("n" + std::to_string(i), {{"CPU", cpus}}, labels);
  return l;
}

}  // namespace

TEST_CASE("placement: strategies, resources and label selectors parse, with clear errors", "[placement]") {
  CHECK(troupe::parse_strategy("strict_spread").value() == PlacementStrategy::strict_spread);
  CHECK(troupe::to_string(PlacementStrategy::strict_pack) == "STRICT_PACK");
  auto bad = troupe::parse_strategy("TIGHT");
  REQUIRE_FALSE(bad.has_value());
  CHECK_THAT(bad.error().message(), Catch::Contains("use PACK, SPREAD, STRICT_PACK or STRICT_SPREAD"));

  auto r = troupe::parse_resources("CPU=4, GPU=0.5,memory=8e9");
  REQUIRE(r.has_value());
  CHECK(r->at("GPU") == 0.5);
  CHECK(r->at("memory") == 8e9);
  CHECK_THAT(troupe::parse_resources("CPU=-1").error().message(), Catch::Contains("needs a number >= 0"));
  CHECK_THAT(troupe::parse_resources("CPU").error().message(), Catch::Contains("is not key=value"));

  auto sel = troupe::parse_label_selector("rack=r1,zone=!z2,gpu=in(a100,h100),pool=!in(spot,preempt)");
  REQUIRE(sel.has_value());
  REQUIRE(sel->size() == 4);
  CHECK(troupe::matches(*sel, {{"rack", "r1"}, {"zone", "z1"}, {"gpu", "h100"}}));
  CHECK_FALSE(troupe::matches(*sel, {{"rack", "r1"}, {"zone", "z2"}, {"gpu", "h100"}}));
  CHECK_FALSE(troupe::matches(*sel, {{"rack", "r1"}, {"gpu", "v100"}}));
  CHECK_FALSE(troupe::matches(*sel, {{"rack", "r1"}, {"gpu", "a100"}, {"pool", "spot"}}));
  CHECK_THAT(troupe::parse_label_selector("rack=").error().message(), Catch::Contains("no value for 'rack'"));
  CHECK_THAT(troupe::parse_label_selector("r ack=1").error().message(), Catch::Contains("bad key"));
}

TEST_CASE("placement: STRICT_SPREAD puts every bundle on its own node, or waits with a reason", "[placement]") {
  Ledger l = cluster(3, 8);
  auto ok = l.place("g1", group(PlacementStrategy::strict_spread, 3, {{"CPU", 2}}));
  REQUIRE(ok.placed);
  CHECK(distinct(ok.nodes) == 3);

  auto four = l.place("g2", group(PlacementStrategy::strict_spread, 4, {{"CPU", 2}}));
  CHECK_FALSE(four.placed);
  CHECK_FALSE(four.feasible);
  CHECK_THAT(four.reason, Catch::Contains("STRICT_SPREAD needs 4 distinct nodes; only 3"));
  // Nothing was reserved by the failed attempt.
  for (NodeIndex n = 0; n < 3; ++n) CHECK(l.free_of(n).at("CPU") == 6);

  l.add_node("n3", {{"CPU", 8}}, {});
  auto later = l.place("g2", group(PlacementStrategy::strict_spread, 4, {{"CPU", 2}}));
  REQUIRE(later.placed);
  CHECK(distinct(later.nodes) == 4);
}

TEST_CASE("placement: STRICT_PACK takes one node or none, PACK spills over as few nodes as it can", "[placement]") {
  Ledger l = cluster(4, 8);
  auto strict = l.place("sp", group(PlacementStrategy::strict_pack, 4, {{"CPU", 2}}));
  REQUIRE(strict.placed);
  CHECK(distinct(strict.nodes) == 1);

  auto too_big = l.place("big", group(PlacementStrategy::strict_pack, 5, {{"CPU", 2}}));
  CHECK_FALSE(too_big.placed);
  CHECK_FALSE(too_big.feasible);
  CHECK_THAT(too_big.reason, Catch::Contains("no alive node is large enough for the whole STRICT_PACK group"));

  // 12 CPUs in bundles of 4 on nodes of 8: two nodes, not three.
  auto pack = l.place("p", group(PlacementStrategy::pack, 3, {{"CPU", 4}}));
  REQUIRE(pack.placed);
  CHECK(distinct(pack.nodes) == 2);

  // Fits one node: PACK keeps it on one.
  auto small = l.place("s", group(PlacementStrategy::pack, 2, {{"CPU", 1}}));
  REQUIRE(small.placed);
  CHECK(distinct(small.nodes) == 1);
}

TEST_CASE("placement: SPREAD uses distinct nodes where it can and shares where it must", "[placement]") {
  Ledger l = cluster(2, 8);
  auto two = l.place("a", group(PlacementStrategy::spread, 2, {{"CPU", 1}}));
  REQUIRE(two.placed);
  CHECK(distinct(two.nodes) == 2);
  auto three = l.place("b", group(PlacementStrategy::spread, 3, {{"CPU", 1}}));
  REQUIRE(three.placed);
  CHECK(distinct(three.nodes) == 2);
}

TEST_CASE("placement: SPREAD with more bundles than nodes puts them as evenly as the nodes' room allows",
          "[placement]") {
  auto per_node = [](const std::vector<NodeIndex>& nodes) {
    std::map<NodeIndex, size_t> n;
    for (NodeIndex node : nodes) ++n[node];
    std::vector<size_t> counts;
    for (auto [node, k] : n) counts.push_back(k);
    std::sort(counts.begin(), counts.end());
    return counts;
  };
  Ledger two = cluster(2, 8);
  auto eight = two.place("a", group(PlacementStrategy::spread, 8, {{"CPU", 1}}));
  REQUIRE(eight.placed);
  CHECK(per_node(eight.nodes) == std::vector<size_t>{4, 4});
  Ledger three = cluster(3, 8);
  auto seven = three.place("b", group(PlacementStrategy::spread, 7, {{"CPU", 1}}));
  REQUIRE(seven.placed);
  CHECK(per_node(seven.nodes) == std::vector<size_t>{2, 2, 3});
  // Where the even split does not fit, the rest goes where there is room.
  Ledger uneven;
  uneven.add_node("small", {{"CPU", 1}}, {});
  uneven.add_node("big", {{"CPU", 8}}, {});
  auto five = uneven.place("c", group(PlacementStrategy::spread, 5, {{"CPU", 1}}));
  REQUIRE(five.placed);
  CHECK(per_node(five.nodes) == std::vector<size_t>{1, 4});
}

TEST_CASE("placement: a group waits for free resources, and is placed once another is released", "[placement]") {
  Ledger l = cluster(1, 8);
  REQUIRE(l.place("first", group(PlacementStrategy::pack, 1, {{"CPU", 6}})).placed);
  auto second = l.place("second", group(PlacementStrategy::pack, 1, {{"CPU", 4}}));
  CHECK_FALSE(second.placed);
  CHECK(second.feasible);  // it could fit an empty node: it waits, it is not infeasible
  CHECK_THAT(second.reason, Catch::Contains("waiting for resources"));
  l.release("first");
  CHECK(l.free_of(0).at("CPU") == 8);
  CHECK(l.place("second", group(PlacementStrategy::pack, 1, {{"CPU", 4}})).placed);
  CHECK_THAT(l.place("second", group(PlacementStrategy::pack, 1, {{"CPU", 1}})).reason,
             Catch::Contains("already exists"));
}

TEST_CASE("placement: bundle label selectors and same-label groups choose the nodes", "[placement]") {
  Ledger l;
  l.add_node("a", {{"CPU", 8}, {"GPU", 8}}, {{"rack", "r1"}, {"gpu", "a100"}});
  l.add_node("b", {{"CPU", 8}, {"GPU", 8}}, {{"rack", "r1"}, {"gpu", "a100"}});
  l.add_node("c", {{"CPU", 8}, {"GPU", 8}}, {{"rack", "r2"}, {"gpu", "h100"}});
  l.add_node("d", {{"CPU", 8}, {"GPU", 8}}, {{"rack", "r2"}, {"gpu", "h100"}});
  l.add_node("e", {{"CPU", 8}, {"GPU", 8}}, {{"rack", "r2"}, {"gpu", "h100"}});

  auto spec = group(PlacementStrategy::strict_spread, 2, {{"GPU", 1}});
  for (auto& b : spec.bundles) b.label_selector = troupe::parse_label_selector("gpu=h100").value();
  auto h100 = l.place("h", spec);
  REQUIRE(h100.placed);
  for (NodeIndex n : h100.nodes) CHECK(l.node(n).labels.at("gpu") == "h100");

  // Three distinct nodes inside one rack: only r2 has three.
  auto rack = group(PlacementStrategy::strict_spread, 3, {{"CPU", 1}});
  rack.same_label = "rack";
  auto in_rack = l.place("rack", rack);
  REQUIRE(in_rack.placed);
  for (NodeIndex n : in_rack.nodes) CHECK(l.node(n).labels.at("rack") == "r2");

  auto nowhere = group(PlacementStrategy::pack, 1, {{"GPU", 1}});
  nowhere.bundles[0].label_selector = troupe::parse_label_selector("gpu=tpu").value();
  auto none = l.place("none", nowhere);
  CHECK_FALSE(none.feasible);
  CHECK_THAT(none.reason, Catch::Contains("with matching labels"));
}

TEST_CASE("placement: STRICT_SPREAD finds a matching where first-fit would block itself", "[placement]") {
  Ledger l;
  l.add_node("x", {{"CPU", 1}}, {{"zone", "z1"}});
  l.add_node("y", {{"CPU", 1}}, {{"zone", "z2"}});
  PlacementGroupSpec spec;
  spec.strategy = PlacementStrategy::strict_spread;
  spec.bundles.push_back(Bundle{{{"CPU", 1}}, troupe::parse_label_selector("zone=in(z1,z2)").value()});
  spec.bundles.push_back(Bundle{{{"CPU", 1}}, troupe::parse_label_selector("zone=z1").value()});
  auto out = l.place("g", spec);
  REQUIRE(out.placed);
  CHECK(l.node(out.nodes[1]).id == "x");
  CHECK(l.node(out.nodes[0]).id == "y");
}

TEST_CASE("placement: a dead node's bundles are rescheduled under the group's strategy", "[placement]") {
  Ledger l = cluster(3, 4);
  auto out = l.place("g", group(PlacementStrategy::strict_spread, 3, {{"CPU", 2}}));
  REQUIRE(out.placed);
  NodeIndex lost = out.nodes[1];
  auto affected = l.remove_node(lost);
  REQUIRE(affected == std::vector<std::string>{"g"});
  CHECK(l.placement("g")[1] == kNoNode);
  // Two alive nodes, both already used by the group: it must wait.
  auto wait = l.reschedule("g");
  CHECK_FALSE(wait.placed);
  l.add_node("n9", {{"CPU", 4}}, {});
  auto back = l.reschedule("g");
  REQUIRE(back.placed);
  CHECK(distinct(back.nodes) == 3);
  CHECK(l.node(back.nodes[1]).id == "n9");
  CHECK(back.nodes[0] == out.nodes[0]);  // the others stayed where they were
  CHECK(back.nodes[2] == out.nodes[2]);
  // Releasing frees only what the live nodes hold.
  l.release("g");
  for (NodeIndex n = 0; n < l.node_count(); ++n) {
    if (l.node(n).alive) CHECK(l.free_of(n).at("CPU") == 4);
  }
}
