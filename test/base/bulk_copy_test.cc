#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "bulk_copy.h"

namespace {
uint8_t pattern(size_t i) { return static_cast<uint8_t>(i * 131 + (i >> 9)); }
}  // namespace

TEST_CASE("bulk_copy copies every byte whatever the alignment and length, and nothing around them", "[base]") {
  using troupe::detail::bulk_copy;
  using troupe::detail::kBulkCopyMinBytes;
  constexpr size_t kMax = 3 * kBulkCopyMinBytes;
  std::vector<uint8_t> src(kMax + 128), dst(kMax + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = pattern(i);
  // Below and above the streaming threshold; lengths that leave a head (a
  // destination off its 64-byte line), whole 16 KiB blocks and a tail.
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, kBulkCopyMinBytes - 1, kBulkCopyMinBytes,
                   kBulkCopyMinBytes + 16384 * 3 + 17, kMax}) {
    for (size_t dst_off : {size_t{0}, size_t{1}, size_t{63}}) {
      for (size_t src_off : {size_t{0}, size_t{5}}) {
        INFO("n " << n << " dst offset " << dst_off << " src offset " << src_off);
        std::fill(dst.begin(), dst.end(), uint8_t{0xAB});
        bulk_copy(dst.data() + dst_off, src.data() + src_off, n);
        size_t wrong = 0;
        for (size_t i = 0; i < n; ++i) wrong += dst[dst_off + i] != src[src_off + i];
        CHECK(wrong == 0);
        size_t touched = 0;
        for (size_t i = 0; i < dst_off; ++i) touched += dst[i] != 0xAB;
        for (size_t i = dst_off + n; i < dst.size(); ++i) touched += dst[i] != 0xAB;
        CHECK(touched == 0);
      }
    }
  }
}
