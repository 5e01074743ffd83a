#include "free_later.h"

#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

namespace troupe::detail {

namespace {

/// Items waiting at most: past it the caller frees inline (the memory waits
/// on nothing unbounded).
constexpr size_t kFreeLaterQueue = 64;

struct Freer {
  std::mutex mu;
  std::condition_variable cv, done_cv;
  std::deque<std::function<void()>> queue;
  uint64_t queued = 0, freed = 0;
  bool started = false, failed = false;

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return !queue.empty(); });
      std::function<void()> next = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      next();
      next = nullptr;
      lock.lock();
      ++freed;
      done_cv.notify_all();
    }
  }
};

Freer& freer();

// A child forked without exec has no freeing thread: it starts its own on
// first use (and frees what the parent had queued: its own copies). The
// lock is held across the fork, so that no thread of the parent's holds it
// in the child; the condition variables are made anew there, for the
// parent's thread was waiting on one, and a child's waiter could lose its
// wake-up to that ghost.
void before_fork() { freer().mu.lock(); }
void after_fork_parent() { freer().mu.unlock(); }
void after_fork_child() {
  Freer& f = freer();
  new (&f.cv) std::condition_variable();
  new (&f.done_cv) std::condition_variable();
  f.started = false;
  f.mu.unlock();
}

Freer& freer() {
  static Freer* f = [] {
    auto* made = new Freer;  // never destroyed: its thread outlives static destruction
    ::pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    return made;
  }();
  return *f;
}

}  // namespace

void free_later(std::function<void()> destroy) {
  Freer& f = freer();
  {
    std::lock_guard<std::mutex> lock(f.mu);
    if (!f.started && !f.failed) {
      try {
        std::thread([&f] { f.run(); }).detach();
        f.started = true;
      } catch (const std::system_error&) {
        f.failed = true;  // no thread: inline from now on
      }
    }
    if (f.started && f.queue.size() < kFreeLaterQueue) {
      f.queue.push_back(std::move(destroy));
      ++f.queued;
      f.cv.notify_one();
      return;
    }
  }
  destroy();
}

void wait_freed() {
  Freer& f = freer();
  std::unique_lock<std::mutex> lock(f.mu);
  const uint64_t target = f.queued;
  f.done_cv.wait(lock, [&] { return f.freed >= target; });
}

}  // namespace troupe::detail
