// Who drives a transport: its own thread, or idle scheduler threads.
//
// A frame that lands while a transport's thread sleeps costs two wake-ups
// before its actor runs (the transport thread, then a scheduler thread), and
// on a busy machine each is tens of microseconds. So scheduler threads with
// nothing to do poll the transport themselves for a while (Transport::poll),
// and frames they receive run on them with no hand-off. The transport's own
// thread steps aside while they do and takes over when they stop: when the
// last spinner goes idle it hands over at once; when a spinner instead left
// to run a long handler, the transport thread takes over after at most
// `watchdog` without a poll.
//
// One thread progresses at a time (the token); frames of one connection are
// handed up in order because reading and handing up happen under it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace troupe::transport {

class ProgressGate {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ProgressGate(std::chrono::microseconds watchdog = std::chrono::milliseconds(1)) : watchdog_(watchdog) {}

  /// The token: whoever holds it may progress the transport and hand events up.
  std::mutex& token() { return token_; }

  /// Runs `progress` under the token if no other thread holds it; never
  /// blocks. Returns what `progress` returned, or false when it did not run.
  template <class F>
  bool try_poll(F&& progress) {
    std::unique_lock<std::mutex> lock(token_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    // The clock on every 64th poll only: reading it costs more than polling
    // an idle transport, and the watchdog is a millisecond.
    if ((polls_++ & 63) == 0) last_poll_ns_.store(now_ns(), std::memory_order_relaxed);
    return progress();
  }

  /// A thread starts (`on`) or stops calling try_poll in a loop. On
  /// stopping, `idle`: it found nothing to do and goes to sleep, so the
  /// transport's thread takes over now; otherwise (it left to run work) the
  /// watchdog decides. (Transport::spin.)
  void spin(bool on, bool idle) {
    std::lock_guard<std::mutex> lock(mu_);
    last_poll_ns_.store(now_ns(), std::memory_order_relaxed);
    if (on) {
      ++spinners_;
    } else if (--spinners_ == 0 && idle) {
      handover_ = true;
      cv_.notify_one();
    }
  }

  /// The transport's thread: blocks while spinners cover progress. Returns
  /// when it should drive progress itself, or when stop() was called.
  void wait_for_turn() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_ && !handover_ && covered()) cv_.wait_for(lock, watchdog_);
    handover_ = false;
  }

  /// Wakes the transport's thread for good.
  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }

 private:
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  }
  /// REQUIRES: mu_. Someone spins now, or polled within the watchdog.
  bool covered() const {
    if (spinners_ > 0) return true;
    return now_ns() - last_poll_ns_.load(std::memory_order_relaxed) <
           std::chrono::duration_cast<std::chrono::nanoseconds>(watchdog_).count();
  }

  std::chrono::microseconds watchdog_;
  std::mutex token_;
  uint64_t polls_ = 0;  // under the token
  std::atomic<int64_t> last_poll_ns_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  int spinners_ = 0;
  bool handover_ = false;
  bool stopped_ = false;
};

}  // namespace troupe::transport
