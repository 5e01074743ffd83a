#include "troupe/collective_buffer.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "collectives/buffer_registry.h"
#include "collectives/shm_slots.h"

namespace troupe {

namespace {

/// 1 TiB: past it an allocation is a bug (a size in elements taken for
/// bytes, a negative size), not a buffer.
constexpr size_t kMaxBufferBytes = size_t{1} << 40;

/// This process's buffers by first byte. A map under a mutex: registering
/// happens once per buffer, lookups once per large collective.
struct Registry {
  struct Entry {
    size_t bytes = 0;
    collectives::SlotsOffer offer;
  };
  std::mutex mu;
  std::map<uintptr_t, Entry> by_start;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: buffers may outlive static destruction
  return *r;
}

}  // namespace

struct CollectiveBuffer::Impl {
  collectives::SlotSegment segment;
  size_t bytes = 0;
};

Result<CollectiveBuffer> CollectiveBuffer::allocate(size_t bytes) {
  if (bytes == 0 || bytes > kMaxBufferBytes) {
    return error(ErrorCode::invalid_argument, "CollectiveBuffer::allocate: " + std::to_string(bytes) +
                                                  " bytes; allocate between 1 byte and 1 TiB");
  }
  auto segment = collectives::SlotSegment::create(1, bytes, "troupe-collective-buffer");
  if (!segment) {
    return error(ErrorCode::storage, "CollectiveBuffer::allocate of " + std::to_string(bytes) +
                                         " bytes: " + segment.error().message());
  }
  CollectiveBuffer b;
  b.impl_ = std::make_unique<Impl>(Impl{std::move(*segment), bytes});
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.by_start[reinterpret_cast<uintptr_t>(b.data())] = Registry::Entry{bytes, b.impl_->segment.offer()};
  return b;
}

CollectiveBuffer::CollectiveBuffer() = default;
CollectiveBuffer::CollectiveBuffer(CollectiveBuffer&&) noexcept = default;

CollectiveBuffer& CollectiveBuffer::operator=(CollectiveBuffer&& o) noexcept {
  if (this != &o) {
    CollectiveBuffer gone(std::move(*this));
    impl_ = std::move(o.impl_);
  }
  return *this;
}

CollectiveBuffer::~CollectiveBuffer() {
  if (!impl_) return;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.by_start.erase(reinterpret_cast<uintptr_t>(data()));
}

std::byte* CollectiveBuffer::data() const { return impl_ ? impl_->segment.slot(0) : nullptr; }
size_t CollectiveBuffer::size() const { return impl_ ? impl_->bytes : 0; }

namespace collectives {

std::optional<RegisteredSpan> find_registered(const void* data, size_t bytes) {
  auto at = reinterpret_cast<uintptr_t>(data);
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.by_start.upper_bound(at);
  if (it == r.by_start.begin()) return std::nullopt;
  --it;
  if (at - it->first > it->second.bytes || bytes > it->second.bytes - (at - it->first)) return std::nullopt;
  return RegisteredSpan{it->second.offer, at - it->first};
}

std::byte* registered_base(uint64_t cookie) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  for (const auto& [start, entry] : r.by_start) {
    if (entry.offer.cookie == cookie) return reinterpret_cast<std::byte*>(start);
  }
  return nullptr;
}

}  // namespace collectives
}  // namespace troupe
