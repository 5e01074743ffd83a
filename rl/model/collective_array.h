// An array of F in a CollectiveBuffer (troupe/collective_buffer.h): the
// storage of a model's parameters and gradients, which a trainer's
// collectives then read and write in place among the ranks of a host
// instead of copying through the arena's slots.
//
// A value type like the std::vector it replaces: a copy is a new buffer
// with the same elements (and, like std::vector's, throws std::bad_alloc
// when the memory for it cannot be had); make() reports that as a value.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <utility>

#include "troupe/collective_buffer.h"
#include "troupe/status.h"

namespace troupe::rl::model {

/// `size()` elements of F, zero-filled when made, in shared memory that
/// host-local collectives read in place. REQUIRES: F trivially copyable.
template <typename F>
class CollectiveArray {
 public:
  /// `count` zeros. Errors: as CollectiveBuffer::allocate.
  static Result<CollectiveArray> make(size_t count) {
    // At least one element: a buffer is 1 byte or more.
    auto memory = CollectiveBuffer::allocate(std::max<size_t>(count, 1) * sizeof(F));
    if (!memory) return error(memory.error());
    CollectiveArray a;
    a.memory_ = std::move(*memory);
    a.size_ = count;
    return a;
  }

  CollectiveArray() = default;
  CollectiveArray(const CollectiveArray& o) : CollectiveArray(copy_of(o)) {}
  CollectiveArray& operator=(const CollectiveArray& o) {
    if (this != &o) *this = copy_of(o);
    return *this;
  }
  CollectiveArray(CollectiveArray&& o) noexcept : memory_(std::move(o.memory_)), size_(std::exchange(o.size_, 0)) {}
  CollectiveArray& operator=(CollectiveArray&& o) noexcept {
    memory_ = std::move(o.memory_);
    size_ = std::exchange(o.size_, 0);
    return *this;
  }

  F* data() { return reinterpret_cast<F*>(memory_.data()); }
  const F* data() const { return reinterpret_cast<const F*>(memory_.data()); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  F* begin() { return data(); }
  F* end() { return data() + size_; }
  const F* begin() const { return data(); }
  const F* end() const { return data() + size_; }

 private:
  static CollectiveArray copy_of(const CollectiveArray& o) {
    auto a = make(o.size_);
    if (!a) throw std::bad_alloc();
    if (o.size_ > 0) std::memcpy(a->data(), o.data(), o.size_ * sizeof(F));
    return std::move(*a);
  }

  CollectiveBuffer memory_;
  size_t size_ = 0;
};

}  // namespace troupe::rl::model
