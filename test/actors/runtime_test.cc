// The Runtime handle: shutdown order, many actors, refusal after shutdown.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/journal.h"
#include "troupe/troupe.h"

using namespace std::chrono_literals;
using troupe::test::Journal;
using troupe::test::JournalPtr;

namespace {
struct Ping {
  int n;
};
class Echo : public troupe::Actor<Echo, Ping> {
 public:
  Echo() = default;
  explicit Echo(JournalPtr j, int id) : j_(std::move(j)), id_(id) {}
  int handle(const Ping& p) { return p.n; }
  void on_stop(const troupe::ExitReason& r) override {
    if (j_) j_->add("stop " + std::to_string(id_) + " " + r.to_string());
  }

 private:
  JournalPtr j_;
  int id_ = 0;
};
}  // namespace

TEST_CASE("shutdown stops thousands of live actors cleanly and returns", "[runtime]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  constexpr int kActors = 5000;
  std::vector<troupe::ActorRef<Echo>> refs;
  refs.reserve(kActors);
  for (int i = 0; i < kActors; ++i) refs.push_back(rt.spawn<Echo>(j, i));
  // Every one is alive and answering.
  std::vector<troupe::Future<int>> answers;
  for (int i = 0; i < kActors; ++i) answers.push_back(refs[i].ask(Ping{i}));
  for (int i = 0; i < kActors; ++i) REQUIRE(answers[i].get().value() == i);
  CHECK(rt.live_actors() == kActors);
  REQUIRE(rt.shutdown().ok());
  CHECK(rt.live_actors() == 0);
  CHECK(j->lines().size() == kActors);
  CHECK(j->count("stop 17 shutdown: stopped by Runtime::stop") == 1);
  // After shutdown, refs fail fast and spawning is refused.
  auto r = refs[0].ask(Ping{1}).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == troupe::ErrorCode::actor_dead);
  CHECK_FALSE(rt.spawn<Echo>());
  CHECK(rt.start_supervisor("late", {}).error().code() == troupe::ErrorCode::shutting_down);
  CHECK(rt.shutdown().ok());  // idempotent
}

TEST_CASE("shutdown stops supervision trees newest first, then the plain actors", "[runtime]") {
  auto j = std::make_shared<Journal>();
  {
    troupe::Runtime rt;
    (void)rt.spawn<Echo>(j, 1);
    REQUIRE(rt.start_supervisor("t1", {.children = {troupe::worker<Echo>("e", j, 10)}}).has_value());
    REQUIRE(rt.start_supervisor("t2", {.children = {troupe::worker<Echo>("e", j, 20)}}).has_value());
    (void)rt.spawn<Echo>(j, 2);
  }  // the destructor shuts down
  auto lines = j->lines();
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == "stop 20 shutdown: terminated by supervisor");
  CHECK(lines[1] == "stop 10 shutdown: terminated by supervisor");
  // Plain actors have no order among themselves; they stop concurrently.
  std::vector<std::string> plain{lines[2], lines[3]};
  std::sort(plain.begin(), plain.end());
  CHECK(plain == std::vector<std::string>{"stop 1 shutdown: stopped by Runtime::stop", "stop 2 shutdown: stopped by Runtime::stop"});
}

TEST_CASE("a monitor from outside an actor times out while the actor lives", "[runtime]") {
  troupe::Runtime rt;
  auto e = rt.spawn<Echo>();
  auto down = rt.monitor(e, 20ms);
  auto r = down.get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == troupe::ErrorCode::timeout);
  rt.stop(e);
  auto gone = rt.monitor(e).get();
  REQUIRE(gone.has_value());
  CHECK(gone->kind == troupe::ExitReason::Kind::shutdown);
}

TEST_CASE("a runtime whose idle threads sleep at once still answers and shuts down", "[runtime]") {
  troupe::RuntimeConfig cfg;
  cfg.sleep_when_idle = true;
  troupe::Runtime rt(cfg);
  auto e = rt.spawn<Echo>();
  for (int i = 0; i < 100; ++i) REQUIRE(e.ask(Ping{i}).get().value() == i);
  CHECK(rt.shutdown().ok());
}
