// CollectiveBuffer (troupe/collective_buffer.h): what it allocates, what it
// refuses, and how the host arena finds the buffer a collective's data lies
// in (collectives/buffer_registry.h). The collectives on such buffers are in
// host_arena_test.cc and cluster_collectives_test.cc.
#include <algorithm>
#include <cstdint>
#include <utility>

#include <catch2/catch.hpp>

#include "collectives/buffer_registry.h"
#include "collectives/shm_slots.h"
#include "troupe/collective_buffer.h"

using troupe::CollectiveBuffer;
using troupe::ErrorCode;
using troupe::collectives::find_registered;
using troupe::collectives::registered_base;

TEST_CASE("collective buffer: zero-filled, page aligned, typed views of its whole size", "[collectives][buffer]") {
  auto b = CollectiveBuffer::allocate(10'000);
  REQUIRE(b.has_value());
  CHECK(b->size() == 10'000);
  CHECK(reinterpret_cast<uintptr_t>(b->data()) % 4096 == 0);
  CHECK(std::all_of(b->data(), b->data() + b->size(), [](std::byte x) { return x == std::byte{0}; }));
  CHECK(b->as<float>().size() == 2'500);
  b->as<float>()[2'499] = 1.5f;
  CHECK(b->as<float>()[2'499] == 1.5f);
}

TEST_CASE("collective buffer: sizes out of range are refused with the range to use", "[collectives][buffer]") {
  for (size_t bytes : {size_t{0}, (size_t{1} << 40) + 1}) {
    auto b = CollectiveBuffer::allocate(bytes);
    REQUIRE_FALSE(b.has_value());
    CHECK(b.error().code() == ErrorCode::invalid_argument);
    CHECK_THAT(b.error().message(), Catch::Contains("between 1 byte and 1 TiB"));
  }
}

TEST_CASE("collective buffer: a collective's data is found in the buffer that holds all of it, until it is freed",
          "[collectives][buffer]") {
  auto a = CollectiveBuffer::allocate(4096 * 3).value();
  auto b = CollectiveBuffer::allocate(100).value();
  auto inside = find_registered(a.data() + 100, 4000);
  REQUIRE(inside.has_value());
  CHECK(inside->offset_bytes == 100);
  CHECK(inside->offer.slot_bytes >= a.size());
  CHECK(registered_base(inside->offer.cookie) == a.data());
  CHECK(find_registered(a.data(), a.size()).has_value());
  CHECK_FALSE(find_registered(a.data() + 1, a.size()).has_value());  // runs past its end
  CHECK_FALSE(find_registered(a.data() - 1, 10).has_value());        // starts before it
  CHECK(find_registered(b.data(), 100).has_value());
  int on_stack = 0;
  CHECK_FALSE(find_registered(&on_stack, sizeof on_stack).has_value());
  // A peer maps it through the offer, sees what was written, and writes
  // where the owner sees it (an allreduce's results, written in place).
  a.as<uint32_t>()[7] = 0xfeed;
  auto peer = troupe::collectives::SlotSegment::open(inside->offer);
  REQUIRE(peer.has_value());
  CHECK(reinterpret_cast<const uint32_t*>(peer->slot(0))[7] == 0xfeed);
  reinterpret_cast<uint32_t*>(peer->slot(0))[8] = 0xbeef;
  CHECK(a.as<uint32_t>()[8] == 0xbeef);
  // Moved: still registered at the same bytes; freed: gone.
  uint64_t cookie = inside->offer.cookie;
  std::byte* at = a.data();
  CollectiveBuffer moved = std::move(a);
  CHECK(moved.data() == at);
  CHECK_FALSE(static_cast<bool>(a));
  CHECK(registered_base(cookie) == at);
  moved = CollectiveBuffer();
  CHECK(registered_base(cookie) == nullptr);
  CHECK_FALSE(find_registered(at, 10).has_value());
  // The peer's mapping keeps the memory (the owner's is gone).
  CHECK(reinterpret_cast<const uint32_t*>(peer->slot(0))[7] == 0xfeed);
}
