// Between rollout and trainer: prompt groups that were generated and
// scored, waiting to be trained on. The trainer takes a step's worth at a
// time, lowest group index first, and the buffer drops (for regeneration)
// any group with a sample older than the step allows: the bound on
// staleness holds for every sample trained on, whatever the timing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "rollout/rollout_engine.h"

namespace troupe::rl::controller {

/// One generated and scored group.
struct GroupRecord {
  uint64_t index = 0;
  std::vector<int32_t> prompt;
  std::vector<rollout::Sample> samples;
  /// Multi-turn episodes: per sample, 1 on the model's tokens (the
  /// environment's observations between turns are 0); empty otherwise.
  std::vector<std::vector<uint8_t>> masks;
  std::vector<double> rewards;
  /// Seconds since the job started when its generation and its scoring
  /// finished.
  double generated_at_s = 0, scored_at_s = 0;
  /// The oldest weight version among its samples' tokens.
  uint64_t oldest_version() const;
};

/// Thread-safe; holds at most `capacity` groups (the group queue's gate
/// keeps it under: a push past it is a broken invariant).
class ReplayBuffer {
 public:
  /// `on_stale(group)` is called for each group dropped as too stale (to
  /// requeue it), with the buffer's lock held.
  ReplayBuffer(size_t capacity, std::function<void(uint64_t)> on_stale)
      : capacity_(capacity), on_stale_(std::move(on_stale)) {}

  void push(GroupRecord record);

  /// What take() got.
  struct Taken {
    std::vector<GroupRecord> groups;
    /// Groups dropped as too stale (already given to on_stale).
    std::vector<uint64_t> stale;
    double waited_s = 0;
  };
  /// Waits for `count` groups whose samples are all of version >= `version`
  /// - `max_staleness`, and takes them (lowest index first); older ones are
  /// dropped into `stale` on the way. Returns with no groups (and the stale
  /// ones found) when `interrupted()`, checked on every wake-up (push,
  /// notify), says so; nullopt once stopped.
  std::optional<Taken> take(size_t count, uint64_t version, uint64_t max_staleness,
                            const std::function<bool()>& interrupted);
  /// Wakes take() to check its interruption.
  void notify();
  void stop();
  size_t size() const;

 private:
  const size_t capacity_;
  const std::function<void(uint64_t)> on_stale_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, GroupRecord> groups_;
  bool stopped_ = false;
};

}  // namespace troupe::rl::controller
