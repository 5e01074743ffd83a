// Placement groups (Ray's semantics): a group of resource bundles reserved
// atomically (all bundles or none) on the cluster's nodes, by a strategy:
//
//   PACK           as few nodes as possible (best effort)
//   SPREAD         a different node for each bundle where possible
//   STRICT_PACK    all bundles on one node, or the group waits
//   STRICT_SPREAD  every bundle on a different node, or the group waits
//
// A bundle may also select nodes by label ("rack=r1", "gpu=in(a100,h100)",
// "zone=!z2"), and a group may ask that all its bundles share the value of one
// label (`same_label = "rack"`: the whole group inside one rack, whichever).
// See docs/cluster.md.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/codec.h"
#include "troupe/status.h"

namespace troupe {

/// How a placement group spreads its bundles over nodes.
enum class PlacementStrategy { pack, spread, strict_pack, strict_spread };

/// "PACK", "SPREAD", "STRICT_PACK" or "STRICT_SPREAD" (any case).
Result<PlacementStrategy> parse_strategy(std::string_view text);
/// The strategy's name as Ray spells it ("STRICT_SPREAD").
std::string_view to_string(PlacementStrategy strategy);

/// Resource amounts by name: "CPU", "GPU", "memory" (bytes) or any custom
/// name. Fractions are allowed (0.5 GPU).
using ResourceMap = std::map<std::string, double>;
/// A node's labels ("rack" -> "r1").
using Labels = std::map<std::string, std::string>;
/// The label every node has, its id: "troupe.node=a1" selects node a1.
inline constexpr const char* kNodeLabel = "troupe.node";

/// One condition on a node's labels.
struct LabelCondition {
  std::string key;
  /// The node's value must be one of `values` (or, negated, none of them;
  /// a node without the label then matches).
  std::vector<std::string> values;
  bool negate = false;

  /// Whether a node with `labels` satisfies this condition.
  bool matches(const Labels& labels) const;

  TROUPE_FIELDS(key, values, negate);
};

/// All conditions must hold.
using LabelSelector = std::vector<LabelCondition>;

/// Whether `labels` satisfy every condition of `selector`.
bool matches(const LabelSelector& selector, const Labels& labels);

/// Parses "rack=r1,zone=!z2,gpu=in(a100,h100),pool=!in(spot,preempt)"; the
/// error names the part it could not read.
Result<LabelSelector> parse_label_selector(std::string_view text);

/// Parses "CPU=4,GPU=1,memory=8e9"; amounts must be >= 0.
Result<ResourceMap> parse_resources(std::string_view text);
/// Parses "rack=r1,zone=z2" into labels.
Result<Labels> parse_labels(std::string_view text);

/// One bundle of a placement group.
struct Bundle {
  ResourceMap resources;
  LabelSelector label_selector{};

  TROUPE_FIELDS(resources, label_selector);
};

/// What to reserve.
struct PlacementGroupSpec {
  /// Optional; unique per namespace when given.
  std::string name{};
  PlacementStrategy strategy = PlacementStrategy::pack;
  std::vector<Bundle> bundles;
  /// When set, every bundle goes to nodes with the same value of this label
  /// (e.g. "rack": the group stays inside one rack).
  std::string same_label{};

  TROUPE_FIELDS(name, strategy, bundles, same_label);
};

}  // namespace troupe
