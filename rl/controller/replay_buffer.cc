#include "controller/replay_buffer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace troupe::rl::controller {

uint64_t GroupRecord::oldest_version() const {
  uint64_t v = rollout::kNoVersion;
  for (const auto& s : samples) v = std::min(v, s.version_first);
  return v;
}

void ReplayBuffer::push(GroupRecord record) {
  {
    std::lock_guard lock(mu_);
    if (groups_.size() >= capacity_) {
      std::fprintf(stderr, "replay buffer: more than %zu groups waiting: the group queue's gate is broken\n", capacity_);
      std::abort();
    }
    groups_.emplace(record.index, std::move(record));
  }
  cv_.notify_all();
}

std::optional<ReplayBuffer::Taken> ReplayBuffer::take(size_t count, uint64_t version, uint64_t max_staleness,
                                                      const std::function<bool()>& interrupted) {
  const auto start = std::chrono::steady_clock::now();
  const uint64_t oldest_ok = version > max_staleness ? version - max_staleness : 0;
  Taken out;
  std::unique_lock lock(mu_);
  for (;;) {
    for (auto it = groups_.begin(); it != groups_.end();) {
      if (it->second.oldest_version() < oldest_ok) {
        out.stale.push_back(it->first);
        on_stale_(it->first);  // regenerate it now: the step waits for it
        it = groups_.erase(it);
      } else {
        ++it;
      }
    }
    if (groups_.size() >= count) {
      for (size_t i = 0; i < count; ++i) {
        out.groups.push_back(std::move(groups_.begin()->second));
        groups_.erase(groups_.begin());
      }
      break;
    }
    if (stopped_) return std::nullopt;
    if (interrupted && interrupted()) break;  // no groups: the caller handles it and asks again
    cv_.wait(lock);
  }
  out.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

void ReplayBuffer::notify() { cv_.notify_all(); }

void ReplayBuffer::stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

size_t ReplayBuffer::size() const {
  std::lock_guard lock(mu_);
  return groups_.size();
}

}  // namespace troupe::rl::controller
