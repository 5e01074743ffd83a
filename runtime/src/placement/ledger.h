// The resource ledger and placement-group scheduler of the head: which node
// has what free, and where each group's bundles are. Single-threaded (the
// head's actor owns it); no I/O, so that it can be tested and benchmarked at
// the scale of 10,000 nodes without processes.
//
// Placing a group is atomic: the assignment is computed against scratch
// copies of the touched nodes' free resources and committed only whole. The
// search is next-fit from a cursor that moves with each placement, so a
// cluster with room answers after a short scan, and groups spread over the
// cluster while each group's bundles pack or spread by its strategy.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "troupe/placement.h"

namespace troupe::cluster {

using NodeIndex = uint32_t;
inline constexpr NodeIndex kNoNode = UINT32_MAX;

/// "{CPU: 2, GPU: 0.5}": resource amounts for messages.
std::string describe(const ResourceMap& r);

/// Resource amounts as a dense vector indexed by interned resource id.
using Amounts = std::vector<double>;

/// The outcome of placing (or re-placing) a group.
struct PlaceOutcome {
  bool placed = false;
  /// False when no node could ever hold it, even empty: it waits for nodes
  /// to join, not for resources to be freed.
  bool feasible = true;
  /// Why it is not placed, for `troupe status`.
  std::string reason;
  /// Per bundle, the node it is on (on success).
  std::vector<NodeIndex> nodes;
};

class Ledger {
 public:
  /// Adds a node (or revives one with the same id, with fresh resources);
  /// its index never changes.
  NodeIndex add_node(const std::string& id, const ResourceMap& total, const Labels& labels);
  /// Marks a node dead. Returns the groups that had bundles on it; those
  /// bundles are lost and the groups need reschedule().
  std::vector<std::string> remove_node(NodeIndex node);
  /// The index of a node by id, or kNoNode.
  NodeIndex find_node(const std::string& id) const;

  /// Reserves a new group. On failure nothing is reserved.
  PlaceOutcome place(const std::string& group, const PlacementGroupSpec& spec);
  /// Places the bundles a group lost with its nodes, keeping the others
  /// where they are (and the strategy's constraints against them).
  PlaceOutcome reschedule(const std::string& group);
  /// Frees a group's bundles (no-op for unknown groups).
  void release(const std::string& group);
  /// Records a group already placed on `nodes` (head recovery): reserves its
  /// bundles there without searching. Bundles on kNoNode or dead nodes are
  /// lost, for reschedule(). False when it does not fit (then nothing is
  /// reserved and the group is not recorded).
  bool restore(const std::string& group, const PlacementGroupSpec& spec, std::vector<NodeIndex> nodes);

  /// Where a group's bundles are (kNoNode for lost ones); empty if unknown.
  std::vector<NodeIndex> placement(const std::string& group) const;

  /// Reserves `demand` on `node` outside any group (a single actor's
  /// resources); false when it does not fit.
  bool acquire(NodeIndex node, const ResourceMap& demand);
  /// Gives back what acquire() took.
  void give_back(NodeIndex node, const ResourceMap& demand);

  struct Node {
    std::string id;
    Amounts total;
    Amounts free;
    Labels labels;
    bool alive = true;
  };
  const Node& node(NodeIndex i) const { return nodes_[i]; }
  size_t node_count() const { return nodes_.size(); }
  /// Free or total resources of a node, by name.
  ResourceMap free_of(NodeIndex i) const { return to_map(nodes_[i].free); }
  ResourceMap total_of(NodeIndex i) const { return to_map(nodes_[i].total); }

 private:
  struct Demand {
    std::vector<std::pair<uint16_t, double>> amounts;  // sparse: only what is asked for
  };
  struct Group {
    PlacementGroupSpec spec;
    std::vector<Demand> demands;  // per bundle
    std::vector<NodeIndex> nodes;  // per bundle; kNoNode when lost or not placed
  };
  /// Scratch free resources of the nodes touched by one placement attempt.
  struct Scratch;

  uint16_t intern(const std::string& name);
  Demand demand_of(const ResourceMap& resources);
  ResourceMap to_map(const Amounts& a) const;
  bool fits(const Amounts& free, const Demand& d) const;
  /// Places bundles `todo` of `g` given the bundles already placed; fills
  /// g.nodes on success (nothing committed yet).
  bool assign(Group& g, const std::vector<size_t>& todo, std::string* reason);
  bool assign_within(Group& g, const std::vector<size_t>& todo, const std::string* label_value, Scratch& s,
                     std::string* reason);
  std::string infeasible_reason(const Group& g, const std::vector<size_t>& todo) const;
  void commit(const Group& g, const std::vector<size_t>& todo);

  std::vector<std::string> resource_names_;
  std::unordered_map<std::string, uint16_t> resource_ids_;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, NodeIndex> node_ids_;
  std::unordered_map<std::string, Group> groups_;
  NodeIndex cursor_ = 0;
};

}  // namespace troupe::cluster
