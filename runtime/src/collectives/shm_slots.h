// Shared-memory slots between two processes of one host: the data path of
// the CPU collectives from a rank to the next when both engines are on the
// same machine (what NCCL's SHM transport and UCX's shared-memory RMA do).
//
// The receiver makes a segment (an anonymous memfd) of `slots` slots of
// `slot_bytes` each and offers (its pid, the fd, a random cookie) to the
// sender, which maps the same memory through /proc/<pid>/fd/<fd> and checks
// the cookie in the segment's header: a process of another host with the
// same pid has no such fd or another segment, and the sender keeps sending
// by messages. The sender copies a chunk into a free slot and tells the
// receiver which (a small message); the receiver reduces or copies straight
// out of the slot and gives it back (another small message). A chunk is
// then copied once on its way, instead of into a message, a frame, the
// kernel twice and out of the frame.
//
// The memory lives until the last of the two processes unmaps it: a peer
// that dies leaves nothing behind (no names in /dev/shm).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "troupe/codec.h"
#include "troupe/status.h"

namespace troupe::collectives {

/// What a receiver sends its sender so that it can map the receiver's slots.
struct SlotsOffer {
  int64_t pid = 0;
  int32_t fd = -1;
  uint64_t cookie = 0;
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;
  /// The offering process's host id (collectives/host_id.h): a process
  /// with another one does not try to map it.
  std::string host;
  TROUPE_FIELDS(pid, fd, cookie, slots, slot_bytes, host);
};

/// A mapping of a slot segment: the receiver's (create) or the sender's
/// (open). Move-only; unmaps (and closes the receiver's fd) when destroyed.
class SlotSegment {
 public:
  SlotSegment() = default;
  SlotSegment(SlotSegment&& o) noexcept;
  SlotSegment& operator=(SlotSegment&& o) noexcept;
  SlotSegment(const SlotSegment&) = delete;
  SlotSegment& operator=(const SlotSegment&) = delete;
  ~SlotSegment();

  /// Makes a segment of `slots` slots of `slot_bytes` (rounded up to a page)
  /// in this process. Pages are only backed when first written. `name`:
  /// the memfd's, as /proc/<pid>/maps shows it.
  static Result<SlotSegment> create(uint32_t slots, uint64_t slot_bytes, const char* name = "troupe-collective-slots");
  /// Maps the segment another process of this host offered, to read and
  /// write; fails (and the caller keeps to messages) when it is not
  /// reachable from here: another host id, another pid namespace, or no
  /// permission on /proc/<pid>/fd.
  static Result<SlotSegment> open(const SlotsOffer& offer);

  /// What to send the sender (the receiver's side).
  const SlotsOffer& offer() const { return offer_; }
  uint32_t slots() const { return offer_.slots; }
  uint64_t slot_bytes() const { return offer_.slot_bytes; }
  /// Slot `index` (< slots()): slot_bytes() bytes, 4 KiB aligned.
  std::byte* slot(uint32_t index) const;
  /// True for a mapped segment.
  explicit operator bool() const { return base_ != nullptr; }
  /// The sender's side: whether its offerer still holds the segment (its
  /// /proc/<pid>/fd/<fd> is the memfd this maps). False once the offerer
  /// closed it (freed the buffer; the fd number may hold another file by
  /// now) or is gone: this mapping is then all that keeps the memory.
  bool still_offered() const;

 private:
  void release();

  int fd_ = -1;  // the receiver's memfd; -1 on the sender's side
  std::byte* base_ = nullptr;
  size_t map_bytes_ = 0;
  SlotsOffer offer_;
  // The sender's side: the memfd's identity when it was opened.
  uint64_t dev_ = 0, inode_ = 0;
};

}  // namespace troupe::collectives
