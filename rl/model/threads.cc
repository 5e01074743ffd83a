#include "model/threads.h"

#include <cblas.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace troupe::rl::model {
namespace {

using Clock = std::chrono::steady_clock;

// How long a pool thread spins for the next region before it sleeps: the
// model's regions follow each other within microseconds during a step, and
// a futex wake-up costs more than that; between steps the threads sleep.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The ticket's range fields are 16 bits.
constexpr size_t kMaxThreads = 256;

size_t all_cores() { return std::max<size_t>(1, std::thread::hardware_concurrency()); }

// Holds OpenBLAS at one thread while any parallel region runs (the pool's
// threads are the parallelism), and puts the caller's setting back after
// the last one ends. OpenBLAS's thread count is process-wide, hence the
// count of regions in flight rather than a save and restore per region.
class BlasSingleThreaded {
 public:
  BlasSingleThreaded() {
    std::lock_guard lock(mutex_);
    if (depth_++ == 0) {
      saved_ = openblas_get_num_threads();
      if (saved_ != 1) openblas_set_num_threads(1);
    }
  }
  ~BlasSingleThreaded() {
    std::lock_guard lock(mutex_);
    if (--depth_ == 0 && saved_ != 1) openblas_set_num_threads(saved_);
  }
  BlasSingleThreaded(const BlasSingleThreaded&) = delete;
  BlasSingleThreaded& operator=(const BlasSingleThreaded&) = delete;

 private:
  static inline std::mutex mutex_;
  static inline int depth_ = 0;
  static inline int saved_ = 1;
};

// Region i of k over [0, n): [n * i / k, n * (i + 1) / k).
inline size_t range_begin(size_t n, size_t i, size_t k) { return n * i / k; }

class Pool {
 public:
  explicit Pool(size_t threads) { start(threads); }
  ~Pool() { stop(); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  size_t threads() const { return threads_.load(std::memory_order_relaxed); }

  void resize(size_t threads) {
    std::lock_guard busy(busy_);
    stop();
    start(threads);
  }

  void run(size_t n, size_t grain, detail::ChunkFn fn, void* ctx) {
    BlasSingleThreaded blas;
    const size_t k = std::max<size_t>(1, std::min(threads(), n / std::max<size_t>(1, grain)));
    // A region nested in a body runs inline (its thread is already one of
    // the region's); so does one that finds the pool busy with another
    // caller's.
    std::unique_lock busy(busy_, std::defer_lock);
    if (k > 1 && !in_region_) (void)busy.try_lock();
    const bool was_in_region = std::exchange(in_region_, true);
    struct Restore {
      bool value;
      ~Restore() { in_region_ = value; }
    } restore{was_in_region};
    if (!busy.owns_lock()) {
      for (size_t i = 0; i < k; ++i) fn(ctx, range_begin(n, i, k), range_begin(n, i + 1, k));
      return;
    }
    fn_.store(fn, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    n_.store(n, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t region = ++region_;
    ticket_.store(region << 32 | uint64_t{k} << 16, std::memory_order_seq_cst);
    wake_sleepers();
    work(region);
    // The other threads finish their ranges; a thread that was descheduled
    // mid-range is waited for (its range is its own).
    for (size_t spins = 0; done_.load(std::memory_order_acquire) < k; ++spins) {
      if (spins < 4096) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  void start(size_t threads) {
    threads_.store(std::min(threads, kMaxThreads), std::memory_order_relaxed);
    stopping_.store(false, std::memory_order_relaxed);
    for (size_t i = 1; i < this->threads(); ++i) workers_.emplace_back([this] { worker(); });
  }

  void stop() {
    stopping_.store(true, std::memory_order_seq_cst);
    ticket_.fetch_add(uint64_t{1} << 32, std::memory_order_seq_cst);
    ++region_;
    wake_sleepers();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  // Called after the ticket moved. A sleeper counted itself under the mutex
  // before checking the ticket, so taking the mutex here orders the wake
  // after its wait began.
  void wake_sleepers() {
    if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
    { std::lock_guard lock(sleep_mutex_); }
    wake_.notify_all();
  }

  // Claims and runs ranges of `region` until none are left.
  void work(uint64_t region) {
    detail::ChunkFn fn = fn_.load(std::memory_order_relaxed);
    void* ctx = ctx_.load(std::memory_order_relaxed);
    const size_t n = n_.load(std::memory_order_relaxed);
    uint64_t t = ticket_.load(std::memory_order_acquire);
    for (;;) {
      const size_t k = (t >> 16) & 0xffff, i = t & 0xffff;
      if ((t >> 32) != region || i >= k) return;
      if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      fn(ctx, range_begin(n, i, k), range_begin(n, i + 1, k));
      done_.fetch_add(1, std::memory_order_release);
      t = ticket_.load(std::memory_order_acquire);
    }
  }

  void worker() {
    pthread_setname_np(pthread_self(), "troupe-compute");
    in_region_ = true;
    uint64_t seen = ticket_.load(std::memory_order_acquire) >> 32;
    for (;;) {
      uint64_t t = ticket_.load(std::memory_order_acquire);
      const auto spin_until = Clock::now() + kSpinBeforeSleep;
      // stopping_ is looked at too: a thread started just before a stop
      // may have read the ticket after the stop moved it.
      for (size_t spins = 0; (t >> 32) == seen && !stopping_.load(std::memory_order_acquire); ++spins) {
        if ((spins & 63) != 63 || Clock::now() < spin_until) {
          cpu_relax();
        } else {
          // Counted as asleep before the last look at the ticket: a caller
          // that moves the ticket after that look sees the count and wakes
          // this thread through the mutex (see wake_sleepers).
          std::unique_lock lock(sleep_mutex_);
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          wake_.wait(lock, [&] {
            return (ticket_.load(std::memory_order_seq_cst) >> 32) != seen || stopping_.load(std::memory_order_seq_cst);
          });
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
        }
        t = ticket_.load(std::memory_order_acquire);
      }
      if (stopping_.load(std::memory_order_acquire)) return;
      seen = t >> 32;
      work(seen);
    }
  }

  // Whether this thread is running a region's ranges.
  static thread_local inline bool in_region_ = false;

  std::atomic<size_t> threads_{1};
  std::mutex busy_;  // held by the caller of the region in flight
  uint64_t region_ = 0;
  std::atomic<uint64_t> ticket_{0};
  std::atomic<detail::ChunkFn> fn_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<size_t> n_{0}, done_{0};
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> workers_;
};

Pool& pool() {
  static Pool p(all_cores());
  return p;
}

}  // namespace

void set_compute_threads(size_t n) { pool().resize(n == 0 ? all_cores() : n); }

size_t compute_threads() { return pool().threads(); }

namespace detail {
void run_parallel(size_t n, size_t grain, ChunkFn fn, void* ctx) { pool().run(n, grain, fn, ctx); }
}  // namespace detail

}  // namespace troupe::rl::model
