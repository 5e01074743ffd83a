// Frees large objects off the threads that must stay responsive. Giving
// back hundreds of MiB (munmap, and on a VM the hypervisor's page-table
// work) can take tens of milliseconds: done on a transport's progress
// thread, it holds back every connection's heartbeats that long, enough for
// a peer with a tight bound to count this process as hung (measured: a
// 256 MiB send's buffer freed on UCX's progress thread, 14 of 100 runs of a
// 50 ms-bound test under load). One process-wide thread does it, started on
// first use; when its queue is full, the caller frees inline (bounded).
#pragma once

#include <cstddef>
#include <functional>

namespace troupe::detail {

/// Objects at least this large are worth handing to the freeing thread.
inline constexpr size_t kFreeLaterMinBytes = size_t{4} << 20;

/// Runs `destroy` (which frees something) on the freeing thread; inline
/// when the queue holds kFreeLaterQueue items already or the thread
/// cannot start.
void free_later(std::function<void()> destroy);

/// `delete p` on the freeing thread (see free_later).
template <class T>
void delete_later(T* p) {
  free_later([p] { delete p; });
}

/// Waits until everything handed over before this call has been freed
/// (tests).
void wait_freed();

}  // namespace troupe::detail
