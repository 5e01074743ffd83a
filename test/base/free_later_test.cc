// free_later (base/src/free_later.h): what a transport's progress thread
// hands over is destroyed on another thread, in order, and when the
// freeing thread is behind by a full queue the caller frees inline rather
// than queueing without bound.
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "free_later.h"

using troupe::detail::free_later;
using troupe::detail::wait_freed;

TEST_CASE("free_later: objects are destroyed on another thread in the order given, and a full queue frees inline",
          "[base]") {
  const std::thread::id me = std::this_thread::get_id();
  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, release = false;
  std::vector<int> order;
  std::vector<std::thread::id> where;
  // The first holds the freeing thread until the queue behind it is full.
  free_later([&] {
    std::unique_lock<std::mutex> l(mu);
    holding = true;
    cv.notify_all();
    cv.wait(l, [&] { return release; });
  });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return holding; });
  }
  auto record = [&](int i) {
    return [&, i] {
      std::lock_guard<std::mutex> l(mu);
      order.push_back(i);
      where.push_back(std::this_thread::get_id());
    };
  };
  // 64 wait in the queue; the next runs here, at once.
  for (int i = 0; i < 64; ++i) free_later(record(i));
  free_later(record(64));
  {
    std::lock_guard<std::mutex> l(mu);
    REQUIRE(order.size() == 1);
    CHECK(order[0] == 64);
    CHECK(where[0] == me);
    release = true;
  }
  cv.notify_all();
  wait_freed();
  std::lock_guard<std::mutex> l(mu);
  REQUIRE(order.size() == 65);
  for (int i = 0; i < 64; ++i) {
    CHECK(order[static_cast<size_t>(i) + 1] == i);
    CHECK(where[static_cast<size_t>(i) + 1] != me);
  }
}
