// Growing a string for bytes that are about to be written over, without
// zeroing them first (a receive buffer: zeroing 64 MiB costs as much as
// receiving it).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace troupe::detail {

/// Makes `s` `n` bytes long; the bytes past its old size are left
/// unwritten, for the caller to fill.
inline void resize_uninitialized(std::string& s, size_t n) {
  s.resize_and_overwrite(n, [](char*, size_t size) { return size; });
  // libstdc++ 12 sets the size to the new capacity, not to `n`, when the
  // string grows out of its inline buffer; shrinking back writes nothing.
  if (s.size() != n) s.resize(n);
}

/// Asks for transparent huge pages under the 2 MiB-aligned part of a large
/// fresh buffer, before it is first written: a 64 MiB receive buffer then
/// takes 32 page faults instead of 16,384. Advice only (ignored where THP
/// is off); small buffers are left alone.
inline void advise_huge_pages(void* p, size_t n) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (n < 2 * kHuge) return;
  uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) & ~(kHuge - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

}  // namespace troupe::detail
