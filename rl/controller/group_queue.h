// The prompt groups the driver hands to the rollout engines, in index
// order, with requeued ones (lost with a worker, or too stale) first, and
// a gate that bounds how far generation may run ahead of training: group g
// is trained at step g / groups_per_step, and may start once the trainer
// has published version (that step - max_staleness). With max_staleness 0
// that is on-policy training (each step's groups start from the weights
// the step trains); with more, rollout keeps generating while the trainer
// trains (AReaL's staleness control).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>

namespace troupe::rl::controller {

/// Thread-safe.
class GroupQueue {
 public:
  /// Groups [first, end) but those in `skip` (trained before a resume),
  /// of a job of `groups_per_step` groups per step.
  GroupQueue(uint64_t groups_per_step, uint64_t max_staleness, uint64_t first, uint64_t end,
             std::set<uint64_t> skip = {});

  /// The next group to generate: a requeued one, else the next in order
  /// once the gate lets it through. Waits; nullopt once stopped, or when
  /// every group has been handed out and none is requeued.
  std::optional<uint64_t> next();
  /// Puts a group back (its generation or reward failed, or it came too
  /// stale); next() hands it out before any new one.
  void requeue(uint64_t group);
  /// The trainer has published `version`: groups up to step version +
  /// max_staleness may start.
  void publish(uint64_t version);
  /// The oldest weights group `group` may be generated with.
  uint64_t min_version(uint64_t group) const;
  /// Wakes every next() with nullopt, for good.
  void stop();
  /// The first group never handed out.
  uint64_t next_fresh() const;

 private:
  bool open(uint64_t group) const;  // REQUIRES: mu_ held

  const uint64_t per_step_, staleness_, end_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_;
  uint64_t published_ = 0;
  bool has_published_ = false;
  std::set<uint64_t> requeued_, skip_;
  bool stopped_ = false;
};

}  // namespace troupe::rl::controller
