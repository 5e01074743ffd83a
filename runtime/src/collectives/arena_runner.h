// One rank's collectives on a host arena (collectives/host_arena.h), run on
// a thread of its own, one at a time in the order submitted: a rank waits
// for the others there, never on an actor's thread. The thread ends after a
// second without work and starts again with the next, so a group that is no
// longer used holds no thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "collectives/host_arena.h"
#include "troupe/status.h"

namespace troupe::collectives {

class ArenaRunner {
 public:
  /// Called on the runner's thread as each collective ends: done, or why
  /// not (HostArena::run's errors), and how its data moved.
  using Done = std::function<void(uint64_t seq, Status status, ArenaPath path)>;

  /// Runs rank `rank`'s collectives on `arena`, which must outlive it.
  ArenaRunner(HostArena& arena, uint32_t rank, Done done);
  /// stop().
  ~ArenaRunner();
  ArenaRunner(const ArenaRunner&) = delete;
  ArenaRunner& operator=(const ArenaRunner&) = delete;

  /// Queues collective `seq` (the caller's sequence number, handed back to
  /// Done). Ignored after stop().
  void submit(uint64_t seq, ArenaCall call, std::chrono::steady_clock::time_point deadline);
  /// Drops the queued collectives and waits for the thread to end. The one
  /// in progress ends when the arena is broken or at its deadline: break it
  /// first (HostArena::abort) to stop at once.
  void stop();

 private:
  struct Job {
    uint64_t seq = 0;
    ArenaCall call;
    std::chrono::steady_clock::time_point deadline;
  };
  void loop();

  HostArena& arena_;
  ArenaRank me_;  // touched only by the runner's thread
  Done done_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job> jobs_;
  bool running_ = false;  // a thread is in loop() or about to be
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace troupe::collectives
