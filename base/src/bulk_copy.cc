#include "bulk_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

namespace troupe::detail {

namespace {
#if defined(__x86_64__)
constexpr size_t kPage = 4096;
constexpr size_t kPagesAtOnce = 4;  // streams the hardware prefetcher follows at once
constexpr size_t kLine = 64;

/// Copies whole blocks of kPagesAtOnce pages; `dst` is 64-byte aligned.
/// Interleaving the pages keeps several DRAM pages open, which is what
/// lets streaming stores reach the memory bandwidth (one stream: ~2/3).
void stream_pages(char* dst, const char* src, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t off = 0; off < kPage; off += kLine) {
      for (size_t p = 0; p < kPagesAtOnce; ++p) {
        const char* s = src + p * kPage + off;
        char* d = dst + p * kPage + off;
        _mm_prefetch(s + 4 * kLine, _MM_HINT_T0);
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
        const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
        const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
        _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b1);
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
      }
    }
    src += kPagesAtOnce * kPage;
    dst += kPagesAtOnce * kPage;
  }
  // Streaming stores are weakly ordered: make them visible before whoever
  // learns that the copy is done reads the bytes.
  _mm_sfence();
}
#endif
}  // namespace

void bulk_copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kBulkCopyMinBytes) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const size_t head = (kLine - (reinterpret_cast<uintptr_t>(d) & (kLine - 1))) & (kLine - 1);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    const size_t blocks = n / (kPagesAtOnce * kPage);
    stream_pages(d, s, blocks);
    const size_t done = blocks * kPagesAtOnce * kPage;
    std::memcpy(d + done, s + done, n - done);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace troupe::detail
