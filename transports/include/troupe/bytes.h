// troupe::Bytes: an immutable, shared run of bytes for large message fields
// (tensors, files, serialized blobs). Copying a Bytes shares the bytes.
//
// Across processes a Bytes field is not copied into the frame: the encoder
// records where it goes and the transport sends it from where it lies (a
// gather list), and the receiver hands out a slice of the frame it received
// instead of a copy (for fields of kZeroCopyMinBytes or more). A received
// Bytes starts 16-byte aligned, so it can be read as floats or doubles. The
// slice keeps the whole received frame alive while any part of it is held.
// Monarch's multipart messages and Ray's zero-copy buffers do the same; a
// std::string field is copied on the way in and on the way out.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace troupe {

class Bytes {
 public:
  /// Fields at least this large travel without being copied into or out of
  /// frames; smaller ones are copied (cheaper than sharing).
  static constexpr size_t kZeroCopyMinBytes = size_t{64} << 10;
  /// Where a received Bytes starts, at least (relative to its frame).
  static constexpr size_t kAlignment = 16;

  /// Empty.
  Bytes() = default;
  /// Takes the string's storage (no copy).
  explicit Bytes(std::string s) {
    if (s.empty()) return;
    auto owner = std::make_shared<const std::string>(std::move(s));
    data_ = owner->data();
    size_ = owner->size();
    owner_ = std::move(owner);
  }
  /// Takes a contiguous container's storage (no copy): std::vector of any
  /// trivially copyable type, so `Bytes::own(std::move(weights))` sends a
  /// vector<float> without copying it.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  static Bytes own(std::vector<T> v) {
    if (v.empty()) return {};
    auto owner = std::make_shared<const std::vector<T>>(std::move(v));
    return Bytes(owner, reinterpret_cast<const char*>(owner->data()), owner->size() * sizeof(T));
  }
  /// Copies `n` bytes at `p`.
  static Bytes copy(const void* p, size_t n) { return Bytes(std::string(static_cast<const char*>(p), n)); }
  /// `n` bytes at `data`, kept alive by `owner` (any object that owns them).
  Bytes(std::shared_ptr<const void> owner, const char* data, size_t n)
      : owner_(n ? std::move(owner) : nullptr), data_(n ? data : nullptr), size_(n) {}

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::string_view view() const { return {data_, size_}; }
  std::span<const std::byte> span() const { return {reinterpret_cast<const std::byte*>(data_), size_}; }
  /// A copy as a string.
  std::string to_string() const { return std::string(view()); }
  /// `n` bytes from `offset`, sharing these (clamped to what there is).
  Bytes slice(size_t offset, size_t n) const {
    if (offset >= size_) return {};
    return Bytes(owner_, data_ + offset, std::min(n, size_ - offset));
  }
  /// Same contents.
  friend bool operator==(const Bytes& a, const Bytes& b) { return a.view() == b.view(); }
  /// True when both share one buffer (what a zero-copy receive gives two
  /// slices of one frame; for tests and diagnostics).
  bool shares_storage_with(const Bytes& o) const { return owner_ && owner_ == o.owner_; }

 private:
  std::shared_ptr<const void> owner_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace troupe
