// The threads the policy model's CPU kernels (kernels.h) run on: one pool
// for the whole process, its size set by set_compute_threads (default: every
// core). A kernel cuts its work into at most compute_threads() ranges that
// depend only on the sizes and the thread count, never on timing, so a run
// is reproducible bit for bit at a given thread count. OpenBLAS is called
// from inside those ranges single-threaded: while a parallel region runs,
// OpenBLAS's own thread count (process-wide) is held at 1 and put back
// after, so the two never oversubscribe the cores; BLAS calls elsewhere in
// the process at that moment get one thread too.
//
//   set_compute_threads(1);   // everything on the caller's thread
//
// parallel_for is what the kernels use; a caller of the model needs only
// the two setters.
#pragma once

#include <cstddef>
#include <type_traits>

namespace troupe::rl::model {

/// Sets the number of threads the model's kernels use (the caller's plus
/// n - 1 pool threads, at most 256), BLAS products included. n = 0 means
/// every core (std::thread::hardware_concurrency()), the default. Blocks
/// until no parallel region runs: not to be called from inside one.
void set_compute_threads(size_t n);
/// The number of threads the kernels use (at least 1).
size_t compute_threads();

namespace detail {
using ChunkFn = void (*)(void* ctx, size_t begin, size_t end);
void run_parallel(size_t n, size_t grain, ChunkFn fn, void* ctx);
}  // namespace detail

/// Runs body(begin, end) over [0, n) cut into contiguous ranges, at most
/// compute_threads() of them and each at least `grain` long (one range when
/// n < 2 * grain), on the pool's threads and the caller's; returns when all
/// have run. The ranges are a function of n, grain and compute_threads()
/// only. OpenBLAS runs single-threaded inside body. A region started while
/// another runs (from another thread, or nested in a body) runs its ranges
/// one after the other on the calling thread: same ranges, same results.
template <typename Body>
void parallel_for(size_t n, size_t grain, Body&& body) {
  using B = std::remove_reference_t<Body>;
  detail::run_parallel(
      n, grain, [](void* ctx, size_t begin, size_t end) { (*static_cast<B*>(ctx))(begin, end); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

}  // namespace troupe::rl::model
