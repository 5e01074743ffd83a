#include "controller/group_queue.h"

#include <cassert>

namespace troupe::rl::controller {

GroupQueue::GroupQueue(uint64_t groups_per_step, uint64_t max_staleness, uint64_t first, uint64_t end,
                       std::set<uint64_t> skip)
    : per_step_(groups_per_step), staleness_(max_staleness), end_(end), next_(first), skip_(std::move(skip)) {
  assert(groups_per_step > 0);
}

bool GroupQueue::open(uint64_t group) const {
  return has_published_ && group / per_step_ <= published_ + staleness_;
}

std::optional<uint64_t> GroupQueue::next() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (stopped_) return std::nullopt;
    if (!requeued_.empty()) {
      uint64_t g = *requeued_.begin();
      requeued_.erase(requeued_.begin());
      return g;
    }
    while (next_ < end_ && skip_.erase(next_) > 0) ++next_;
    if (next_ >= end_) {
      // Everything was handed out; a failure may still requeue a group.
      cv_.wait(lock);
      continue;
    }
    if (open(next_)) return next_++;
    cv_.wait(lock);
  }
}

void GroupQueue::requeue(uint64_t group) {
  {
    std::lock_guard lock(mu_);
    requeued_.insert(group);
  }
  cv_.notify_one();
}

void GroupQueue::publish(uint64_t version) {
  {
    std::lock_guard lock(mu_);
    published_ = version;
    has_published_ = true;
  }
  cv_.notify_all();
}

uint64_t GroupQueue::min_version(uint64_t group) const {
  const uint64_t step = group / per_step_;
  return step > staleness_ ? step - staleness_ : 0;
}

void GroupQueue::stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

uint64_t GroupQueue::next_fresh() const {
  std::lock_guard lock(mu_);
  return next_;
}

}  // namespace troupe::rl::controller
