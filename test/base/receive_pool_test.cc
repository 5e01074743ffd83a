// The receive-buffer pool (base/src/receive_pool.h): a large buffer given
// back serves the next frame of a size it fits, with its storage; small
// frames never pin large buffers; what it keeps is bounded. Its counters
// are the process's, so these tests compare them before and after.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "receive_pool.h"

using troupe::detail::drain_receive_pool;
using troupe::detail::give_receive_buffer;
using troupe::detail::kPooledMinBytes;
using troupe::detail::receive_pool_stats;
using troupe::detail::take_receive_buffer;

namespace {
constexpr size_t kMiB = size_t{1} << 20;
}

TEST_CASE("receive pool: a buffer given back serves the next frame that fits, with its storage", "[base]") {
  drain_receive_pool();
  const auto before = receive_pool_stats();
  std::string a = take_receive_buffer(4 * kMiB);
  REQUIRE(a.size() == 4 * kMiB);
  a.back() = 'x';  // writable to its end
  CHECK(receive_pool_stats().fresh == before.fresh + 1);
  const char* storage = a.data();
  give_receive_buffer(std::move(a));
  CHECK(receive_pool_stats().kept == 1);
  CHECK(receive_pool_stats().kept_bytes >= 4 * kMiB);

  std::string b = take_receive_buffer(4 * kMiB - 100);  // a little smaller: the same buffer
  CHECK(b.size() == 4 * kMiB - 100);
  CHECK(b.data() == storage);
  CHECK(receive_pool_stats().reused == before.reused + 1);
  CHECK(receive_pool_stats().kept == 0);
  CHECK(receive_pool_stats().kept_bytes == 0);

  // Larger than any kept buffer: a fresh one, the kept one stays.
  give_receive_buffer(std::move(b));
  std::string c = take_receive_buffer(5 * kMiB);
  CHECK(c.data() != storage);
  CHECK(receive_pool_stats().kept == 1);
  CHECK(receive_pool_stats().fresh == before.fresh + 2);
  drain_receive_pool();
  CHECK(receive_pool_stats().kept == 0);
}

TEST_CASE("receive pool: a frame of less than half a kept buffer, or below the pooled size, takes a fresh one",
          "[base]") {
  drain_receive_pool();
  std::string big = take_receive_buffer(16 * kMiB);
  const char* storage = big.data();
  give_receive_buffer(std::move(big));
  std::string half = take_receive_buffer(7 * kMiB);  // would pin 16 MiB for 7
  CHECK(half.data() != storage);
  CHECK(receive_pool_stats().kept == 1);

  const auto before = receive_pool_stats();
  std::string small = take_receive_buffer(kPooledMinBytes - 1);
  CHECK(small.size() == kPooledMinBytes - 1);
  give_receive_buffer(std::move(small));  // not kept
  CHECK(receive_pool_stats().kept == 1);
  CHECK(receive_pool_stats().fresh == before.fresh);  // small takes are not counted as fresh pooled ones
  drain_receive_pool();
}

TEST_CASE("receive pool: it keeps at most 16 buffers, the latest, within its byte bound", "[base]") {
  drain_receive_pool();
  std::vector<std::string> buffers;
  std::vector<const char*> storage;
  for (size_t i = 0; i < 20; ++i) {
    buffers.push_back(take_receive_buffer(kMiB + i * 4096));
    storage.push_back(buffers.back().data());
  }
  for (auto& b : buffers) give_receive_buffer(std::move(b));
  CHECK(receive_pool_stats().kept == 16);
  CHECK(receive_pool_stats().kept_bytes <= size_t{256} << 20);
  // The four given first went; the last one given is still there.
  std::string last = take_receive_buffer(kMiB + 19 * 4096);
  CHECK(last.data() == storage[19]);
  std::string first = take_receive_buffer(kMiB);  // fits in any of the kept: the smallest kept is #4
  CHECK(first.data() == storage[4]);

  // A byte bound: 17 buffers of 16 MiB would be 272 MiB; at most 256 are kept.
  drain_receive_pool();
  buffers.clear();
  for (size_t i = 0; i < 17; ++i) buffers.push_back(take_receive_buffer(16 * kMiB));
  for (auto& b : buffers) give_receive_buffer(std::move(b));
  CHECK(receive_pool_stats().kept_bytes <= size_t{256} << 20);
  CHECK(receive_pool_stats().kept >= 15);
  drain_receive_pool();
}
