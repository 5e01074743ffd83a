#include "collectives/arena_runner.h"

#include <pthread.h>

#include <utility>

namespace troupe::collectives {

namespace {
/// How long the thread waits for the next collective before it ends.
constexpr auto kIdle = std::chrono::seconds(1);
}  // namespace

ArenaRunner::ArenaRunner(HostArena& arena, uint32_t rank, Done done)
    : arena_(arena), me_{rank}, done_(std::move(done)) {}

ArenaRunner::~ArenaRunner() { stop(); }

void ArenaRunner::submit(uint64_t seq, ArenaCall call, std::chrono::steady_clock::time_point deadline) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  jobs_.push_back(Job{seq, std::move(call), deadline});
  if (running_) {
    wake_.notify_one();
    return;
  }
  // The last thread left loop() (idle): it holds no lock and touches nothing
  // any more, so joining it here is immediate.
  if (thread_.joinable()) thread_.join();
  running_ = true;
  thread_ = std::thread([this] { loop(); });
}

void ArenaRunner::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    jobs_.clear();
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void ArenaRunner::loop() {
  pthread_setname_np(pthread_self(), "troupe.arena");  // in top, perf and gdb
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait_for(lock, kIdle, [this] { return stopping_ || !jobs_.empty(); });
    if (stopping_ || jobs_.empty()) {
      running_ = false;
      return;
    }
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    const uint64_t in_place_before = me_.in_place_calls, direct_before = me_.direct_calls;
    auto result = arena_.run(me_, job.call, job.deadline);
    const ArenaPath path = me_.direct_calls != direct_before     ? ArenaPath::written_in_place
                           : me_.in_place_calls != in_place_before ? ArenaPath::read_in_place
                                                                   : ArenaPath::slots;
    done_(job.seq, result ? Status() : result.error(), path);
    lock.lock();
  }
}

}  // namespace troupe::collectives
