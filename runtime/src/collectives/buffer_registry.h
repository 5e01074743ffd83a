// The CollectiveBuffers of this process (troupe/collective_buffer.h), as the
// host arena finds them: which one a collective's buffer lies in, and where
// another process of the host maps it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "collectives/shm_slots.h"

namespace troupe::collectives {

/// A span of a registered buffer, as another process of this host names it.
struct RegisteredSpan {
  /// The buffer's segment: one slot of the buffer's size.
  SlotsOffer offer;
  /// Where the span starts in the slot.
  uint64_t offset_bytes = 0;
};

/// The CollectiveBuffer of this process that holds all of [data, data +
/// bytes), if one does. Any thread.
std::optional<RegisteredSpan> find_registered(const void* data, size_t bytes);

/// The first byte of this process's CollectiveBuffer with `cookie`, or
/// nullptr when there is none (freed): how a rank reaches a buffer of a rank
/// in its own process without mapping it again. Any thread.
std::byte* registered_base(uint64_t cookie);

}  // namespace troupe::collectives
