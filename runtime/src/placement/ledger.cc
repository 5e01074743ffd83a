#include "ledger.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <unordered_set>

namespace troupe::cluster {

namespace {
// Amounts are sums of user-given doubles; compare with a little slack so that
// 0.1 + 0.2 of a GPU still fits in 0.3.
constexpr double kEpsilon = 1e-9;

}  // namespace

std::string describe(const ResourceMap& r) {
  std::string s = "{";
  for (auto& [k, v] : r) {
    if (s.size() > 1) s += ", ";
    s += k + ": " + std::to_string(v);
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s + "}";
}

/// Free resources of the nodes one attempt has touched, on top of the ledger.
struct Ledger::Scratch {
  std::vector<std::pair<NodeIndex, Amounts>> touched;

  const Amounts& free(const Ledger& l, NodeIndex n) const {
    for (auto& [node, amounts] : touched) {
      if (node == n) return amounts;
    }
    return l.nodes_[n].free;
  }
  void take(const Ledger& l, NodeIndex n, const Demand& d) {
    Amounts* a = nullptr;
    for (auto& [node, amounts] : touched) {
      if (node == n) a = &amounts;
    }
    if (a == nullptr) {
      touched.emplace_back(n, l.nodes_[n].free);
      a = &touched.back().second;
    }
    for (auto [rid, amount] : d.amounts) {
      if (rid >= a->size()) a->resize(rid + 1, 0.0);
      (*a)[rid] -= amount;
    }
  }
};

uint16_t Ledger::intern(const std::string& name) {
  auto it = resource_ids_.find(name);
  if (it != resource_ids_.end()) return it->second;
  auto id = static_cast<uint16_t>(resource_names_.size());
  resource_names_.push_back(name);
  resource_ids_.emplace(name, id);
  return id;
}

Ledger::Demand Ledger::demand_of(const ResourceMap& resources) {
  Demand d;
  for (auto& [name, amount] : resources) {
    if (amount > 0) d.amounts.emplace_back(intern(name), amount);
  }
  return d;
}

ResourceMap Ledger::to_map(const Amounts& a) const {
  ResourceMap m;
  for (size_t i = 0; i < a.size() && i < resource_names_.size(); ++i) {
    if (a[i] != 0) m[resource_names_[i]] = a[i];
  }
  return m;
}

bool Ledger::fits(const Amounts& free, const Demand& d) const {
  for (auto [rid, amount] : d.amounts) {
    double have = rid < free.size() ? free[rid] : 0.0;
    if (have + kEpsilon < amount) return false;
  }
  return true;
}

NodeIndex Ledger::add_node(const std::string& id, const ResourceMap& total, const Labels& labels) {
  Amounts amounts;
  for (auto& [name, amount] : total) {
    uint16_t rid = intern(name);
    if (rid >= amounts.size()) amounts.resize(rid + 1, 0.0);
    amounts[rid] = amount;
  }
  NodeIndex index;
  if (auto it = node_ids_.find(id); it != node_ids_.end()) {
    index = it->second;  // a node that comes back starts empty: its old bundles were rescheduled
  } else {
    index = static_cast<NodeIndex>(nodes_.size());
    nodes_.emplace_back();
    node_ids_.emplace(id, index);
  }
  Node& n = nodes_[index];
  n.id = id;
  n.total = amounts;
  n.free = std::move(amounts);
  n.labels = labels;
  n.alive = true;
  return index;
}

NodeIndex Ledger::find_node(const std::string& id) const {
  auto it = node_ids_.find(id);
  return it == node_ids_.end() ? kNoNode : it->second;
}

std::vector<std::string> Ledger::remove_node(NodeIndex node) {
  std::vector<std::string> affected;
  if (node >= nodes_.size() || !nodes_[node].alive) return affected;
  nodes_[node].alive = false;
  std::fill(nodes_[node].free.begin(), nodes_[node].free.end(), 0.0);
  for (auto& [id, g] : groups_) {
    bool hit = false;
    for (NodeIndex& n : g.nodes) {
      if (n == node) {
        n = kNoNode;
        hit = true;
      }
    }
    if (hit) affected.push_back(id);
  }
  return affected;
}

PlaceOutcome Ledger::place(const std::string& group, const PlacementGroupSpec& spec) {
  PlaceOutcome out;
  auto refuse = [&](std::string why) {
    out.feasible = false;
    out.reason = std::move(why);
    return out;
  };
  if (groups_.count(group)) return refuse("placement group " + group + " already exists");
  if (spec.bundles.empty()) return refuse("a placement group needs at least one bundle");
  Group g;
  g.spec = spec;
  for (size_t i = 0; i < spec.bundles.size(); ++i) {
    g.demands.push_back(demand_of(spec.bundles[i].resources));
    if (g.demands.back().amounts.empty()) {
      return refuse("bundle " + std::to_string(i) + " asks for no resources (give at least one amount > 0)");
    }
  }
  g.nodes.assign(spec.bundles.size(), kNoNode);
  std::vector<size_t> todo(spec.bundles.size());
  std::iota(todo.begin(), todo.end(), size_t{0});
  if (!assign(g, todo, &out.reason)) {
    std::string never = infeasible_reason(g, todo);
    if (!never.empty()) {
      out.feasible = false;
      out.reason = std::move(never);
    }
    return out;
  }
  commit(g, todo);
  out.placed = true;
  out.nodes = g.nodes;
  groups_.emplace(group, std::move(g));
  return out;
}

PlaceOutcome Ledger::reschedule(const std::string& group) {
  PlaceOutcome out;
  auto it = groups_.find(group);
  if (it == groups_.end()) {
    out.feasible = false;
    out.reason = "no placement group " + group;
    return out;
  }
  Group& g = it->second;
  std::vector<size_t> todo;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i] == kNoNode) todo.push_back(i);
  }
  if (!todo.empty()) {
    Group trial = g;
    if (!assign(trial, todo, &out.reason)) {
      std::string never = infeasible_reason(trial, todo);
      if (!never.empty()) {
        out.feasible = false;
        out.reason = std::move(never);
      }
      return out;
    }
    commit(trial, todo);
    g.nodes = trial.nodes;
  }
  out.placed = true;
  out.nodes = g.nodes;
  return out;
}

void Ledger::release(const std::string& group) {
  auto it = groups_.find(group);
  if (it == groups_.end()) return;
  const Group& g = it->second;
  for (size_t b = 0; b < g.nodes.size(); ++b) {
    NodeIndex n = g.nodes[b];
    if (n == kNoNode || !nodes_[n].alive) continue;
    Amounts& free = nodes_[n].free;
    for (auto [rid, amount] : g.demands[b].amounts) {
      if (rid >= free.size()) free.resize(rid + 1, 0.0);
      double cap = rid < nodes_[n].total.size() ? nodes_[n].total[rid] : 0.0;
      free[rid] = std::min(cap, free[rid] + amount);
    }
  }
  groups_.erase(it);
}

bool Ledger::restore(const std::string& group, const PlacementGroupSpec& spec, std::vector<NodeIndex> nodes) {
  if (groups_.count(group) || nodes.size() != spec.bundles.size()) return false;
  Group g;
  g.spec = spec;
  for (auto& b : spec.bundles) g.demands.push_back(demand_of(b.resources));
  for (NodeIndex& n : nodes) {
    if (n != kNoNode && (n >= nodes_.size() || !nodes_[n].alive)) n = kNoNode;
  }
  g.nodes = std::move(nodes);
  std::vector<size_t> held;
  Scratch s;
  for (size_t b = 0; b < g.nodes.size(); ++b) {
    if (g.nodes[b] == kNoNode) continue;
    if (!fits(s.free(*this, g.nodes[b]), g.demands[b])) return false;
    s.take(*this, g.nodes[b], g.demands[b]);
    held.push_back(b);
  }
  commit(g, held);
  groups_.emplace(group, std::move(g));
  return true;
}

std::vector<NodeIndex> Ledger::placement(const std::string& group) const {
  auto it = groups_.find(group);
  return it == groups_.end() ? std::vector<NodeIndex>{} : it->second.nodes;
}

bool Ledger::acquire(NodeIndex node, const ResourceMap& demand) {
  if (node >= nodes_.size() || !nodes_[node].alive) return false;
  Demand d = demand_of(demand);
  if (!fits(nodes_[node].free, d)) return false;
  for (auto [rid, amount] : d.amounts) nodes_[node].free[rid] -= amount;
  return true;
}

void Ledger::give_back(NodeIndex node, const ResourceMap& demand) {
  if (node >= nodes_.size() || !nodes_[node].alive) return;
  Node& n = nodes_[node];
  for (auto [rid, amount] : demand_of(demand).amounts) {
    if (rid >= n.free.size()) n.free.resize(rid + 1, 0.0);
    double cap = rid < n.total.size() ? n.total[rid] : 0.0;
    n.free[rid] = std::min(cap, n.free[rid] + amount);
  }
}

void Ledger::commit(const Group& g, const std::vector<size_t>& todo) {
  for (size_t b : todo) {
    Amounts& free = nodes_[g.nodes[b]].free;
    for (auto [rid, amount] : g.demands[b].amounts) {
      if (rid >= free.size()) free.resize(rid + 1, 0.0);
      free[rid] -= amount;
    }
  }
}

bool Ledger::assign(Group& g, const std::vector<size_t>& todo, std::string* reason) {
  const std::string& key = g.spec.same_label;
  if (key.empty()) {
    Scratch s;
    return assign_within(g, todo, nullptr, s, reason);
  }
  // Bundles already placed fix the label value; else try each value, from
  // the cursor on, until one takes the whole group.
  for (size_t b = 0; b < g.nodes.size(); ++b) {
    if (g.nodes[b] == kNoNode) continue;
    auto it = nodes_[g.nodes[b]].labels.find(key);
    if (it == nodes_[g.nodes[b]].labels.end()) break;
    Scratch s;
    return assign_within(g, todo, &it->second, s, reason);
  }
  std::unordered_set<std::string> tried;
  size_t n = nodes_.size();
  for (size_t k = 0; k < n; ++k) {
    const Node& node = nodes_[(cursor_ + k) % n];
    if (!node.alive) continue;
    auto it = node.labels.find(key);
    if (it == node.labels.end() || !tried.insert(it->second).second) continue;
    Scratch s;
    Group trial = g;
    if (assign_within(trial, todo, &it->second, s, reason)) {
      g.nodes = trial.nodes;
      return true;
    }
  }
  *reason = "waiting for resources: no single '" + key + "' value has room for the whole group";
  return false;
}

bool Ledger::assign_within(Group& g, const std::vector<size_t>& todo, const std::string* label_value, Scratch& s,
                           std::string* reason) {
  const size_t n = nodes_.size();
  if (n == 0) {
    *reason = "waiting for nodes: the cluster has none";
    return false;
  }
  const PlacementStrategy strategy = g.spec.strategy;
  auto eligible = [&](NodeIndex node, size_t b) {
    const Node& nd = nodes_[node];
    if (!nd.alive) return false;
    if (label_value != nullptr) {
      auto it = nd.labels.find(g.spec.same_label);
      if (it == nd.labels.end() || it->second != *label_value) return false;
    }
    return matches(g.spec.bundles[b].label_selector, nd.labels);
  };
  auto fits_now = [&](NodeIndex node, size_t b) { return fits(s.free(*this, node), g.demands[b]); };
  // Most constrained first: selectors, then size.
  std::vector<size_t> order = todo;
  auto weight = [&](size_t b) {
    double w = 0;
    for (auto [rid, amount] : g.demands[b].amounts) w += amount;
    return w;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (g.spec.bundles[a].label_selector.size() != g.spec.bundles[b].label_selector.size()) {
      return g.spec.bundles[a].label_selector.size() > g.spec.bundles[b].label_selector.size();
    }
    return weight(a) > weight(b);
  });
  std::vector<NodeIndex> used;  // nodes of this group, placed earlier or now
  for (NodeIndex node : g.nodes) {
    if (node != kNoNode) used.push_back(node);
  }
  auto is_used = [&](NodeIndex node) { return std::find(used.begin(), used.end(), node) != used.end(); };
  auto put = [&](size_t b, NodeIndex node) {
    s.take(*this, node, g.demands[b]);
    g.nodes[b] = node;
    if (!is_used(node)) used.push_back(node);
  };
  // Every bundle of `order` on one node, if it takes them all.
  auto all_on = [&](NodeIndex node) {
    Scratch trial = s;
    for (size_t b : order) {
      if (!eligible(node, b) || !fits(trial.free(*this, node), g.demands[b])) return false;
      trial.take(*this, node, g.demands[b]);
    }
    s = std::move(trial);
    for (size_t b : order) g.nodes[b] = node;
    return true;
  };
  // The first node from the cursor on that takes bundle b (optionally one
  // this group does not use yet).
  auto next_fit = [&](size_t b, bool fresh_only) {
    for (size_t k = 0; k < n; ++k) {
      auto node = static_cast<NodeIndex>((cursor_ + k) % n);
      if ((!fresh_only || !is_used(node)) && eligible(node, b) && fits_now(node, b)) return node;
    }
    return kNoNode;
  };
  auto no_room = [&](size_t b) {
    return "waiting for resources: bundle " + std::to_string(b) + " " + describe(g.spec.bundles[b].resources) +
           " fits no node's free resources";
  };
  NodeIndex last = kNoNode;
  bool ok = true;
  switch (strategy) {
    case PlacementStrategy::strict_pack:
    case PlacementStrategy::pack: {
      // One node for the whole group: the group's own node if it has one.
      bool done = false;
      for (NodeIndex node : std::vector<NodeIndex>(used)) {
        if ((done = all_on(node))) {
          last = node;
          break;
        }
      }
      if (!done && (used.empty() || strategy == PlacementStrategy::pack)) {
        for (size_t k = 0; k < n && !done; ++k) {
          auto node = static_cast<NodeIndex>((cursor_ + k) % n);
          if ((done = all_on(node))) last = node;
        }
      }
      if (done || strategy == PlacementStrategy::strict_pack) {
        ok = done;
        if (!ok) *reason = "waiting for resources: no node has room for the whole STRICT_PACK group";
        break;
      }
      // PACK, best effort: fill the group's nodes first, then next-fit.
      for (size_t b : order) {
        NodeIndex pick = kNoNode;
        for (NodeIndex node : used) {
          if (eligible(node, b) && fits_now(node, b)) {
            pick = node;
            break;
          }
        }
        if (pick == kNoNode) pick = next_fit(b, false);
        if (pick == kNoNode) {
          ok = false;
          *reason = no_room(b);
          break;
        }
        put(b, pick);
        last = pick;
      }
      break;
    }
    case PlacementStrategy::strict_spread:
    case PlacementStrategy::spread: {
      std::vector<size_t> unplaced;
      for (size_t b : order) {
        NodeIndex pick = next_fit(b, true);
        if (pick == kNoNode) {
          unplaced.push_back(b);
          continue;
        }
        put(b, pick);
        last = pick;
      }
      if (unplaced.empty()) break;
      if (strategy == PlacementStrategy::spread) {
        // Best effort: share nodes where no fresh one has room, each bundle
        // on the node with room that holds fewest of the group's (Ray's
        // "as even as possible": 8 bundles on 2 nodes are 4 + 4, not 7 + 1).
        auto least_loaded_fit = [&](size_t b) {
          NodeIndex pick = kNoNode;
          size_t fewest = SIZE_MAX;
          for (size_t k = 0; k < n; ++k) {
            auto node = static_cast<NodeIndex>((cursor_ + k) % n);
            if (!eligible(node, b) || !fits_now(node, b)) continue;
            auto held = static_cast<size_t>(std::count(g.nodes.begin(), g.nodes.end(), node));
            if (held < fewest) {
              fewest = held;
              pick = node;
            }
          }
          return pick;
        };
        for (size_t b : unplaced) {
          NodeIndex pick = least_loaded_fit(b);
          if (pick == kNoNode) {
            ok = false;
            *reason = no_room(b);
            break;
          }
          put(b, pick);
        }
        break;
      }
      // STRICT_SPREAD: greedy failed; a matching of bundles to distinct
      // nodes may still exist (different selectors), found by augmenting
      // paths over each bundle's candidate nodes.
      std::vector<NodeIndex> fixed;  // nodes of bundles placed before this call
      for (size_t b = 0; b < g.nodes.size(); ++b) {
        if (g.nodes[b] != kNoNode && std::find(todo.begin(), todo.end(), b) == todo.end()) fixed.push_back(g.nodes[b]);
      }
      std::vector<std::vector<NodeIndex>> candidates(order.size());
      for (size_t i = 0; i < order.size(); ++i) {
        for (NodeIndex node = 0; node < n; ++node) {
          if (std::find(fixed.begin(), fixed.end(), node) == fixed.end() && eligible(node, order[i]) &&
              fits(nodes_[node].free, g.demands[order[i]])) {
            candidates[i].push_back(node);
          }
        }
      }
      std::unordered_map<NodeIndex, size_t> owner;  // node -> index into order
      std::function<bool(size_t, std::unordered_set<NodeIndex>&)> augment = [&](size_t i,
                                                                                 std::unordered_set<NodeIndex>& seen) {
        for (NodeIndex node : candidates[i]) {
          if (!seen.insert(node).second) continue;
          auto it = owner.find(node);
          if (it == owner.end() || augment(it->second, seen)) {
            owner[node] = i;
            return true;
          }
        }
        return false;
      };
      size_t matched = 0;
      for (size_t i = 0; i < order.size(); ++i) {
        std::unordered_set<NodeIndex> seen;
        if (augment(i, seen)) ++matched;
      }
      if (matched < order.size()) {
        ok = false;
        *reason = "waiting for resources: STRICT_SPREAD needs " + std::to_string(todo.size() + fixed.size()) +
                  " distinct nodes with room; " + std::to_string(matched + fixed.size()) + " can take one now";
        break;
      }
      s = Scratch{};
      for (auto& [node, i] : owner) {
        s.take(*this, node, g.demands[order[i]]);
        g.nodes[order[i]] = node;
        last = node;
      }
      break;
    }
  }
  if (!ok) {
    for (size_t b : todo) g.nodes[b] = kNoNode;
    return false;
  }
  if (last != kNoNode) {
    bool packing = strategy == PlacementStrategy::pack || strategy == PlacementStrategy::strict_pack;
    cursor_ = static_cast<NodeIndex>(packing ? last : (last + 1) % n);
  }
  return true;
}

std::string Ledger::infeasible_reason(const Group& g, const std::vector<size_t>& todo) const {
  // Judged against total (not free) resources: what could never fit.
  auto could_hold = [&](NodeIndex node, size_t b) {
    const Node& nd = nodes_[node];
    return nd.alive && matches(g.spec.bundles[b].label_selector, nd.labels) && fits(nd.total, g.demands[b]);
  };
  size_t n = nodes_.size();
  for (size_t b : todo) {
    bool any = false;
    for (NodeIndex node = 0; node < n && !any; ++node) any = could_hold(node, b);
    if (!any) {
      std::string sel = g.spec.bundles[b].label_selector.empty() ? "" : " with matching labels";
      return "infeasible: bundle " + std::to_string(b) + " " + describe(g.spec.bundles[b].resources) +
             " is larger than any alive node" + sel + " (it waits for such a node to join)";
    }
  }
  if (g.spec.strategy == PlacementStrategy::strict_pack) {
    Demand sum;
    std::unordered_map<uint16_t, double> total;
    for (size_t b : todo) {
      for (auto [rid, amount] : g.demands[b].amounts) total[rid] += amount;
    }
    for (auto [rid, amount] : total) sum.amounts.emplace_back(rid, amount);
    bool any = false;
    for (NodeIndex node = 0; node < n && !any; ++node) {
      const Node& nd = nodes_[node];
      any = nd.alive && fits(nd.total, sum) &&
            std::all_of(todo.begin(), todo.end(),
                        [&](size_t b) { return matches(g.spec.bundles[b].label_selector, nd.labels); });
    }
    if (!any) {
      return "infeasible: no alive node is large enough for the whole STRICT_PACK group (it waits for one to join)";
    }
  }
  if (g.spec.strategy == PlacementStrategy::strict_spread) {
    size_t distinct = 0;
    for (NodeIndex node = 0; node < n; ++node) {
      if (std::any_of(todo.begin(), todo.end(), [&](size_t b) { return could_hold(node, b); })) ++distinct;
    }
    if (distinct < g.spec.bundles.size()) {
      return "infeasible: STRICT_SPREAD needs " + std::to_string(g.spec.bundles.size()) +
             " distinct nodes; only " + std::to_string(distinct) + " alive nodes could hold a bundle (it waits for more)";
    }
  }
  return {};
}

}  // namespace troupe::cluster
