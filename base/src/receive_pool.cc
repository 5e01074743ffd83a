#include "receive_pool.h"

#include <cstdlib>
#include <deque>
#include <mutex>

#include "uninitialized.h"

namespace troupe::detail {

namespace {

/// At most this many buffers kept: a few frames in flight per peer.
constexpr size_t kMaxBuffers = 16;

size_t max_bytes() {
  static const size_t bytes = [] {
    const char* e = std::getenv("TROUPE_RECEIVE_POOL_MIB");
    if (e == nullptr || *e == '\0') return size_t{256} << 20;
    char* end = nullptr;
    unsigned long long mib = std::strtoull(e, &end, 10);
    return end != nullptr && *end == '\0' ? static_cast<size_t>(mib) << 20 : size_t{256} << 20;
  }();
  return bytes;
}

struct Pool {
  std::mutex mu;
  std::deque<std::string> kept;  // oldest first
  ReceivePoolStats stats;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: buffers may come back during exit
  return *p;
}

}  // namespace

std::string take_receive_buffer(size_t n) {
  std::string out;
  if (n >= kPooledMinBytes) {
    Pool& p = pool();
    std::lock_guard lock(p.mu);
    // The smallest that fits, and not more than twice the frame.
    auto best = p.kept.end();
    for (auto it = p.kept.begin(); it != p.kept.end(); ++it) {
      size_t cap = it->capacity();
      if (cap >= n && cap / 2 <= n && (best == p.kept.end() || cap < best->capacity())) best = it;
    }
    if (best != p.kept.end()) {
      out = std::move(*best);
      p.kept.erase(best);
      p.stats.kept_bytes -= out.capacity();
      ++p.stats.reused;
    } else {
      ++p.stats.fresh;
    }
    p.stats.kept = p.kept.size();
  }
  const bool fresh = out.capacity() < n;
  resize_uninitialized(out, n);
  if (fresh) advise_huge_pages(out.data(), n);
  return out;
}

void give_receive_buffer(std::string&& buffer) {
  const size_t cap = buffer.capacity();
  if (cap < kPooledMinBytes || cap > max_bytes()) return;
  std::deque<std::string> evicted;  // freed outside the lock
  {
    Pool& p = pool();
    std::lock_guard lock(p.mu);
    // The oldest go first: the sizes a process receives recur, and the
    // latest are the likeliest to come again.
    while (!p.kept.empty() && (p.kept.size() >= kMaxBuffers || p.stats.kept_bytes + cap > max_bytes())) {
      p.stats.kept_bytes -= p.kept.front().capacity();
      evicted.push_back(std::move(p.kept.front()));
      p.kept.pop_front();
    }
    p.kept.push_back(std::move(buffer));
    p.stats.kept_bytes += cap;
    p.stats.kept = p.kept.size();
  }
}

ReceivePoolStats receive_pool_stats() {
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  return p.stats;
}

void drain_receive_pool() {
  std::deque<std::string> freed;
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  freed.swap(p.kept);
  p.stats.kept = 0;
  p.stats.kept_bytes = 0;
}

}  // namespace troupe::detail
