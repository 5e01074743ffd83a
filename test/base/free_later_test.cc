// free_later (base/src/free_later.h): what a transport's progress thread
// hands over is destroyed on another thread, in order, and when the
// freeing thread is behind by a full queue the caller frees inline rather
// than queueing without bound; a child forked without exec gets a freeing
// thread of its own.
#include <sys/wait.h>
#include <unistd.h>

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

TEST_CASE("free_later: a child forked without exec frees on a thread of its own", "[base]") {
  free_later([] {});  // the parent's freeing thread runs, and waits on its queue
  wait_freed();
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // With no thread of its own here they would wait forever: the alarm
    // ends the child then (killed by a signal, not an exit).
    ::alarm(20);
    const std::thread::id me = std::this_thread::get_id();
    std::mutex mu;
    int elsewhere = 0;
    for (int i = 0; i < 10; ++i) {
      free_later([&] {
        std::lock_guard<std::mutex> l(mu);
        elsewhere += std::this_thread::get_id() != me;
      });
    }
    wait_freed();
    std::lock_guard<std::mutex> l(mu);
    ::_exit(elsewhere == 10 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
