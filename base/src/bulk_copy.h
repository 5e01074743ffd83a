// Copies of large buffers that do not go through the cache.
#pragma once

#include <cstddef>

namespace troupe::detail {

/// Below this many bytes bulk_copy is memcpy: a copy that fits in the
/// caches is faster through them (a 1 MiB read over shared memory, repeated,
/// lost 30% with streaming stores), and the destination is likely read
/// soon. At 4 MiB (the weight sync's default bucket) they are even.
inline constexpr size_t kBulkCopyMinBytes = size_t{4} << 20;

/// Copies `n` bytes from `src` to `dst` (which must not overlap), for large
/// one-off copies: remote-buffer reads and writes over shared memory, weight
/// buffers. From kBulkCopyMinBytes up it writes with non-temporal stores,
/// four pages at a time (what glibc's memcpy does only above 3/4 of the
/// last-level cache: hundreds of MiB on a VM that reports a large L3, which
/// leaves a 64 MiB copy at ~60% of the memory bandwidth).
void bulk_copy(void* dst, const void* src, size_t n);

}  // namespace troupe::detail
