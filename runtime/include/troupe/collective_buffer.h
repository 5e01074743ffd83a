// CPU memory that the collectives of ranks on one host read in place: the
// CPU counterpart of NCCL's user-buffer registration (ncclMemAlloc +
// ncclCommRegister) and of MPI_Win_allocate_shared.
//
//   auto grads = troupe::CollectiveBuffer::allocate(n * sizeof(float));   // once, in the member
//   std::span<float> g = grads->as<float>();
//   ... fill g ...
//   ask<void>(group_.engine(self()), troupe::AllReduce{group_.id, group_.rank, g.data(), g.size(),
//                                                      troupe::DType::float32, troupe::ReduceOp::avg})
//
// A collective on ordinary memory goes through the group's arena on each
// host: every rank copies its buffer into the arena's slots and the results
// out again. When a rank's buffer lies inside a CollectiveBuffer, the other
// ranks of its host read its data where it is (the buffer is shared memory,
// mapped by them on first use), and the rank reduces its share in place:
// the copies into the slots are gone. When every rank's buffer is one, an
// allreduce needs no slots at all: each rank folds its segment of all the
// buffers and writes the result straight into each of them, so every
// buffer is read once and written once, the floor of an allreduce's
// memory traffic. Ranks may mix the two; each gains where its own buffer
// is registered. Nothing else changes: the same calls, results bit for bit
// the same, the same failure semantics (docs/meshes.md): a failed
// collective hands its buffer back only once no other rank writes into it.
//
// The memory is a memfd of this process: it does not appear in /dev/shm,
// and it is freed when the last process that maps it lets it go (a peer
// keeps its mapping of a buffer freed here until a few newer ones of this
// rank have replaced it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "troupe/status.h"

namespace troupe {

/// A block of CPU memory, zero-filled, page aligned, that host-local
/// collectives read in place. Move-only; freeing it while a collective on
/// it is in flight is the caller's bug, as for any collective buffer.
class CollectiveBuffer {
 public:
  /// Allocates `bytes` (1 byte to 1 TiB; pages are backed when first
  /// written). Errors: invalid_argument for a size out of range, storage
  /// when the memory cannot be had (memfd, ftruncate or mmap failed: the
  /// message says which, with the system's reason).
  static Result<CollectiveBuffer> allocate(size_t bytes);

  CollectiveBuffer();
  CollectiveBuffer(CollectiveBuffer&&) noexcept;
  CollectiveBuffer& operator=(CollectiveBuffer&&) noexcept;
  ~CollectiveBuffer();

  /// The first byte; nullptr for an empty (moved-from, default) buffer.
  std::byte* data() const;
  /// Bytes usable from data().
  size_t size() const;
  /// True for an allocated buffer.
  explicit operator bool() const { return impl_ != nullptr; }

  /// The buffer as elements of T (size() / sizeof(T) of them).
  template <class T>
  std::span<T> as() const {
    return {reinterpret_cast<T*>(data()), size() / sizeof(T)};
  }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
