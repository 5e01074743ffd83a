// Supervision trees: OTP strategies, restart types, intensity and escalation,
// backoff, snapshots, mailbox semantics across restarts, shutdown order.
#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "support/journal.h"
#include "troupe/troupe.h"

using namespace std::chrono_literals;
using troupe::ErrorCode;
using troupe::Restart;
using troupe::Strategy;
using troupe::test::Journal;
using troupe::test::JournalPtr;
using troupe::test::starting_with;

namespace {

struct Crash {};
struct Quit {};
struct Put {
  int n;
};
struct Total {};
struct Hang {
  std::chrono::milliseconds d;
};

std::string kind_name(const troupe::ExitReason& r) {
  switch (r.kind) {
    case troupe::ExitReason::Kind::normal: return "normal";
    case troupe::ExitReason::Kind::shutdown: return "shutdown";
    case troupe::ExitReason::Kind::failed: return "failed";
    case troupe::ExitReason::Kind::killed: return "killed";
  }
  return "?";
}

// Journals its life cycle: "start NAME", "stop NAME KIND".
class Probe : public troupe::Actor<Probe, Crash, Quit, Put, Total, Hang> {
 public:
  Probe(JournalPtr j, std::string name, bool fail_start = false)
      : j_(std::move(j)), name_(std::move(name)), fail_start_(fail_start) {}
  void on_start() override {
    j_->add("start " + name_);
    if (fail_start_) throw std::runtime_error("cannot open the thing");
  }
  void on_stop(const troupe::ExitReason& r) override { j_->add("stop " + name_ + " " + kind_name(r)); }
  std::optional<std::string> snapshot() override { return std::to_string(total_); }
  void restore(std::string_view s) override { total_ = std::stoi(std::string(s)); }

  void handle(const Crash&) { throw std::runtime_error("crash in " + name_); }
  void handle(const Quit&) { stop(); }
  void handle(const Put& p) {
    total_ += p.n;
    checkpoint();
  }
  int handle(const Total&) { return total_; }
  // Blocks its thread on purpose, to test shutdown budgets.
  void handle(const Hang& h) {
    j_->add("hang " + name_);
    std::this_thread::sleep_for(h.d);
  }

 private:
  JournalPtr j_;
  std::string name_;
  bool fail_start_;
  int total_ = 0;
};

troupe::ChildSpec probe(const JournalPtr& j, const std::string& name, Restart r = Restart::permanent) {
  return troupe::worker<Probe>(name, j, name).with_restart(r);
}

troupe::RuntimeConfig config_with_reports(const JournalPtr& reports, size_t threads = 0) {
  troupe::RuntimeConfig cfg;
  cfg.threads = threads;
  cfg.on_crash_report = [reports](const troupe::CrashReport& r) { reports->add(r.actor + " " + r.decision); };
  return cfg;
}

troupe::ActorRef<Probe> child(const troupe::SupervisorRef& sup, const std::string& name) {
  auto c = sup.child<Probe>(name);
  REQUIRE(c.has_value());
  return *c;
}

// Lines after the first occurrence of `marker`.
std::vector<std::string> after(const std::vector<std::string>& lines, const std::string& marker) {
  auto it = std::find(lines.begin(), lines.end(), marker);
  if (it == lines.end()) return {};
  return {it + 1, lines.end()};
}

}  // namespace

TEST_CASE("children start in order and a tree stops them in reverse order", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  {
    troupe::Runtime rt;
    auto sup = rt.start_supervisor("app", {.children = {probe(j, "a"), probe(j, "b"), probe(j, "c")}});
    REQUIRE(sup.has_value());
    CHECK(j->lines() == std::vector<std::string>{"start a", "start b", "start c"});
    REQUIRE(rt.shutdown().ok());
  }
  CHECK(j->lines() == std::vector<std::string>{"start a", "start b", "start c", "stop c shutdown",
                                               "stop b shutdown", "stop a shutdown"});
}

TEST_CASE("one_for_one restarts only the child that crashed, keeping its ref valid", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  auto reports = std::make_shared<Journal>();
  troupe::Runtime rt(config_with_reports(reports));
  auto sup = rt.start_supervisor("s", {.strategy = Strategy::one_for_one, .intensity = 5,
                                       .children = {probe(j, "a"), probe(j, "b"), probe(j, "c")}});
  REQUIRE(sup.has_value());
  auto b = child(*sup, "b");
  REQUIRE(b.tell(Crash{}).ok());
  REQUIRE(b.ask(Total{}).get().has_value());  // answered by the new incarnation
  CHECK(after(j->lines(), "start c") == std::vector<std::string>{"stop b failed", "start b"});
  CHECK(reports->lines() == std::vector<std::string>{"/s/b restart"});
  CHECK(child(*sup, "b") == b);
  auto kids = sup->which_children().value();
  REQUIRE(kids.size() == 3);
  CHECK(kids[1].restarts == 1);
  CHECK(kids[0].restarts == 0);
}

TEST_CASE("one_for_all stops the siblings in reverse order and restarts all in order", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  auto sup = rt.start_supervisor("s", {.strategy = Strategy::one_for_all, .intensity = 5,
                                       .children = {probe(j, "a"), probe(j, "b"), probe(j, "c")}});
  REQUIRE(sup.has_value());
  auto b = child(*sup, "b");
  REQUIRE(b.tell(Crash{}).ok());
  REQUIRE(j->wait_for("start c", 2));
  CHECK(after(j->lines(), "start c") ==
        std::vector<std::string>{"stop b failed", "stop c shutdown", "stop a shutdown", "start a", "start b", "start c"});
}

TEST_CASE("rest_for_one restarts the crashed child and those started after it", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  auto sup = rt.start_supervisor("s", {.strategy = Strategy::rest_for_one, .intensity = 5,
                                       .children = {probe(j, "a"), probe(j, "b"), probe(j, "c"), probe(j, "d")}});
  REQUIRE(sup.has_value());
  REQUIRE(child(*sup, "b").tell(Crash{}).ok());
  REQUIRE(j->wait_for("start d", 2));
  CHECK(after(j->lines(), "start d") ==
        std::vector<std::string>{"stop b failed", "stop d shutdown", "stop c shutdown", "start b", "start c", "start d"});
  CHECK(j->count("start a") == 1);
}

TEST_CASE("simple_one_for_one starts dynamic children of one kind and restarts them one by one", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  auto sup = rt.start_supervisor("pool", {.strategy = Strategy::simple_one_for_one, .intensity = 5,
                                          .children = {probe(j, "tmpl")}});
  REQUIRE(sup.has_value());
  CHECK(j->lines().empty());
  std::vector<troupe::ActorRef<Probe>> workers;
  for (int i = 0; i < 3; ++i) {
    auto w = sup->start_child<Probe>(j, "w" + std::to_string(i));
    REQUIRE(w.has_value());
    workers.push_back(*w);
  }
  CHECK(workers[1].path() == "/pool/tmpl-2");
  REQUIRE(workers[1].tell(Crash{}).ok());
  REQUIRE(workers[1].ask(Total{}).get().has_value());
  CHECK(j->count("start w1") == 2);
  CHECK(j->count("start w0") == 1);
  CHECK(j->count("start w2") == 1);
  REQUIRE(sup->terminate_child("tmpl-1").ok());
  CHECK(j->count("stop w0 shutdown") == 1);
  CHECK(sup->which_children().value().size() == 2);
  // A child of another class is refused.
  struct Other : troupe::Actor<Other, Total> {
    int handle(const Total&) { return 0; }
  };
  auto wrong = sup->start_child<Other>();
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.error().code() == ErrorCode::type_mismatch);
}

TEST_CASE("restart types: permanent always, transient only after a crash, temporary never", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  auto sup = rt.start_supervisor("s", {.intensity = 10,
                                       .children = {probe(j, "perm", Restart::permanent),
                                                    probe(j, "trans", Restart::transient),
                                                    probe(j, "temp", Restart::temporary)}});
  REQUIRE(sup.has_value());
  // A monitor fires only after the child told its supervisor it stopped, so
  // which_children() afterwards sees the supervisor's decision.
  SECTION("a normal exit") {
    auto perm = child(*sup, "perm");
    REQUIRE(perm.tell(Quit{}).ok());
    REQUIRE(perm.ask(Total{}).get().has_value());  // answered by the restarted one
    CHECK(j->count("start perm") == 2);
    auto trans = child(*sup, "trans");
    auto temp = child(*sup, "temp");
    auto trans_down = rt.monitor(trans);
    auto temp_down = rt.monitor(temp);
    REQUIRE(trans.tell(Quit{}).ok());
    REQUIRE(temp.tell(Quit{}).ok());
    REQUIRE(trans_down.get().has_value());
    REQUIRE(temp_down.get().has_value());
    auto kids = sup->which_children().value();
    // temp is removed, trans stays in the list but does not run.
    REQUIRE(kids.size() == 2);
    CHECK(kids[0].running);
    CHECK_FALSE(kids[1].running);
    CHECK(j->count("start trans") == 1);
    CHECK(j->count("start temp") == 1);
  }
  SECTION("a crash") {
    auto trans = child(*sup, "trans");
    REQUIRE(trans.tell(Crash{}).ok());
    REQUIRE(trans.ask(Total{}).get().has_value());
    CHECK(j->count("start trans") == 2);
    auto temp = child(*sup, "temp");
    auto down = rt.monitor(temp);
    REQUIRE(temp.tell(Crash{}).ok());
    REQUIRE(down.get().has_value());
    auto kids = sup->which_children().value();
    REQUIRE(kids.size() == 2);
    CHECK(kids[1].running);
    CHECK(j->count("start temp") == 1);
    auto gone = sup->child_ref("temp");
    CHECK(gone.error().code() == ErrorCode::not_found);
  }
}

TEST_CASE("exceeding the restart intensity escalates through two levels of supervisors", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  auto reports = std::make_shared<Journal>();
  troupe::Runtime rt(config_with_reports(reports));
  troupe::SupervisorSpec mid{.strategy = Strategy::one_for_one, .intensity = 1, .period = 5s,
                             .children = {probe(j, "w1"), probe(j, "w2")}};
  // top tolerates no restart at all: mid's failure makes it give up too.
  auto top = rt.start_supervisor("top", {.intensity = 0, .children = {probe(j, "first"), troupe::supervisor("mid", mid)}});
  REQUIRE(top.has_value());
  auto top_down = rt.monitor(top->ref());
  auto mid_ref = top->child_ref("mid").value();
  auto w2 = troupe::SupervisorRef(mid_ref).child<Probe>("w2").value();
  REQUIRE(w2.tell(Crash{}).ok());
  REQUIRE(w2.ask(Total{}).get().has_value());  // first crash: restarted
  REQUIRE(w2.tell(Crash{}).ok());              // second within 5 s: mid gives up
  auto reason = top_down.get();
  REQUIRE(reason.has_value());
  CHECK(reason->kind == troupe::ExitReason::Kind::failed);
  CHECK_THAT(reason->message, Catch::Contains("max restart intensity"));
  CHECK(reports->lines() ==
        std::vector<std::string>{"/top/mid/w2 restart", "/top/mid/w2 escalate", "/top/mid escalate", "/top terminate"});
  // Each supervisor stopped its children in reverse order, then itself went.
  auto stops = starting_with(j->lines(), "stop");
  CHECK(stops == std::vector<std::string>{"stop w2 failed", "stop w2 failed", "stop w1 shutdown", "stop first shutdown"});
  CHECK(rt.live_actors() == 0);
}

TEST_CASE("an escalated subtree is restarted by its parent with fresh children", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  troupe::SupervisorSpec mid{.intensity = 0, .children = {probe(j, "w")}};
  auto top = rt.start_supervisor("top", {.intensity = 5, .children = {troupe::supervisor("mid", mid)}});
  REQUIRE(top.has_value());
  auto mid_ref = top->child_ref("mid").value();
  auto w = troupe::SupervisorRef(mid_ref).child<Probe>("w").value();
  REQUIRE(w.tell(Put{5}).ok());
  REQUIRE(w.tell(Crash{}).ok());
  REQUIRE(j->wait_for("start w", 2));
  // mid is the same actor (restarted in place); its child is a new one.
  CHECK(top->child_ref("mid").value() == mid_ref);
  auto w_new = troupe::SupervisorRef(mid_ref).child<Probe>("w").value();
  CHECK_FALSE(w_new == w);
  auto total = w_new.ask(Total{}).get();
  REQUIRE(total.has_value());
  CHECK(*total == 0);
  CHECK(w.ask(Total{}).get().error().code() == ErrorCode::actor_dead);
}

TEST_CASE("backoff delay grows exponentially, is capped, and jitters within the random factor", "[supervisor]") {
  troupe::Backoff b{.min = 100ms, .max = 1000ms, .random_factor = 0.5, .reset_after = 10s};
  CHECK(b.delay(0, 0.0) == 100ms);
  CHECK(b.delay(1, 0.0) == 200ms);
  CHECK(b.delay(3, 0.0) == 800ms);
  CHECK(b.delay(4, 0.0) == 1000ms);
  CHECK(b.delay(200, 0.0) == 1000ms);
  CHECK(b.delay(0, 0.5) == 125ms);
  CHECK(b.delay(4, 0.999999) < 1500ms);
}

TEST_CASE("restarts with backoff wait at least the backoff delay, and not much longer", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  troupe::Backoff b{.min = 20ms, .max = 80ms, .random_factor = 0.5, .reset_after = 10s};
  auto sup = rt.start_supervisor("s", {.intensity = 100, .children = {probe(j, "w").with_backoff(b)}});
  REQUIRE(sup.has_value());
  auto w = child(*sup, "w");
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto t0 = std::chrono::steady_clock::now();
    REQUIRE(w.tell(Crash{}).ok());
    REQUIRE(w.ask(Total{}).get().has_value());  // answered once restarted
    auto waited = std::chrono::steady_clock::now() - t0;
    auto expected = b.delay(static_cast<uint32_t>(attempt), 0.0);
    CHECK(waited >= expected);
    // Upper bound: the jitter plus generous scheduling slack on a shared machine.
    CHECK(waited <= expected * 1.5 + 500ms);
  }
}

TEST_CASE("a restarted actor comes back with the state of its last snapshot", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  auto sup = rt.start_supervisor("s", {.intensity = 5, .children = {probe(j, "w")}});
  REQUIRE(sup.has_value());
  auto w = child(*sup, "w");
  REQUIRE(w.tell(Put{40}).ok());
  REQUIRE(w.tell(Put{2}).ok());
  REQUIRE(w.tell(Crash{}).ok());
  auto total = w.ask(Total{}).get();
  REQUIRE(total.has_value());
  CHECK(*total == 42);
  CHECK(j->count("start w") == 2);
}

namespace {
// Takes no explicit checkpoints: relies on snapshot_every.
struct Inc {};
class Tally : public troupe::Actor<Tally, Inc, Total, Crash> {
 public:
  void handle(const Inc&) { ++n_; }
  int handle(const Total&) { return n_; }
  void handle(const Crash&) { throw std::runtime_error("tally crash"); }
  std::optional<std::string> snapshot() override { return std::to_string(n_); }
  void restore(std::string_view s) override { n_ = std::stoi(std::string(s)); }

 private:
  int n_ = 0;
};
}  // namespace

TEST_CASE("snapshot_every takes snapshots without explicit checkpoints", "[supervisor]") {
  troupe::Runtime rt;
  auto sup = rt.start_supervisor(
      "s", {.intensity = 5, .children = {troupe::worker_with<Tally>("t", {.snapshot_every = 1})}});
  REQUIRE(sup.has_value());
  auto t = sup->child<Tally>("t").value();
  for (int i = 0; i < 5; ++i) REQUIRE(t.tell(Inc{}).ok());
  REQUIRE(t.tell(Crash{}).ok());
  CHECK(t.ask(Total{}).get().value() == 5);
}

TEST_CASE("messages queued behind a crash go to the new incarnation, the crashing one is not redelivered", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  auto sup = rt.start_supervisor("s", {.intensity = 5, .children = {probe(j, "w")}});
  REQUIRE(sup.has_value());
  auto w = child(*sup, "w");
  auto crash = w.ask(Crash{});
  for (int i = 0; i < 100; ++i) REQUIRE(w.tell(Put{1}).ok());
  auto total = w.ask(Total{}).get();
  REQUIRE(total.has_value());
  CHECK(*total == 100);
  auto crashed = crash.get();
  REQUIRE_FALSE(crashed.has_value());
  CHECK(crashed.error().code() == ErrorCode::handler_failed);
  CHECK(j->count("start w") == 2);
}

TEST_CASE("a child that does not stop within its shutdown budget is abandoned, not waited for", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt({.threads = 4});
  auto sup = rt.start_supervisor(
      "s", {.strategy = Strategy::one_for_all, .intensity = 5,
            .children = {probe(j, "slow").with_shutdown(50ms), probe(j, "fast")}});
  REQUIRE(sup.has_value());
  auto slow = child(*sup, "slow");
  auto fast = child(*sup, "fast");
  REQUIRE(slow.tell(Hang{2s}).ok());
  // Supervisor commands overtake queued messages: wait until slow is inside
  // the handler, or its stop would simply run first.
  REQUIRE(j->wait_for("hang slow"));
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(fast.tell(Crash{}).ok());
  REQUIRE(j->wait_for("start fast", 2));
  CHECK(std::chrono::steady_clock::now() - t0 < 1500ms);
  // The abandoned incarnation's cell goes once its handler returns; the
  // restarted child lives in a fresh one.
  auto fresh = child(*sup, "slow");
  CHECK_FALSE(fresh == slow);
  REQUIRE(rt.monitor(slow, 10s).get().has_value());
  CHECK(fresh.ask(Total{}).get().has_value());
}

TEST_CASE("a supervisor whose child fails to start reports why and stops the others", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  auto sup = rt.start_supervisor(
      "s", {.children = {probe(j, "a"), troupe::worker<Probe>("bad", j, std::string("bad"), true), probe(j, "c")}});
  REQUIRE_FALSE(sup.has_value());
  CHECK(sup.error().code() == ErrorCode::start_failed);
  CHECK_THAT(sup.error().message(), Catch::Contains("cannot open the thing"));
  CHECK_THAT(sup.error().message(), Catch::Contains("bad"));
  CHECK(j->count("start c") == 0);
  REQUIRE(j->wait_for("stop a shutdown"));
}

TEST_CASE("bad supervisor specs are refused with the field named", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  auto dup = rt.start_supervisor("s", {.children = {probe(j, "a"), probe(j, "a")}});
  REQUIRE_FALSE(dup.has_value());
  CHECK(dup.error().code() == ErrorCode::already_exists);
  CHECK_THAT(dup.error().message(), Catch::Contains("'a'"));
  auto simple = rt.start_supervisor("s", {.strategy = Strategy::simple_one_for_one, .children = {}});
  REQUIRE_FALSE(simple.has_value());
  CHECK(simple.error().code() == ErrorCode::invalid_argument);
  auto period = rt.start_supervisor("s", {.period = 0ms, .children = {}});
  CHECK(period.error().code() == ErrorCode::invalid_argument);
}

TEST_CASE("children can be added, terminated, restarted and deleted at run time", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  auto sup = rt.start_supervisor("s", {.children = {probe(j, "a")}});
  REQUIRE(sup.has_value());
  auto b = sup->start_child(probe(j, "b"));
  REQUIRE(b.has_value());
  CHECK(b->path() == "/s/b");
  CHECK(sup->start_child(probe(j, "b")).error().code() == ErrorCode::already_exists);
  REQUIRE(sup->terminate_child("b").ok());
  CHECK(j->count("stop b shutdown") == 1);
  CHECK(sup->delete_child("a").code() == ErrorCode::invalid_argument);
  auto again = sup->restart_child("b");
  REQUIRE(again.has_value());
  CHECK(j->count("start b") == 2);
  REQUIRE(sup->terminate_child("b").ok());
  REQUIRE(sup->delete_child("b").ok());
  CHECK(sup->which_children().value().size() == 1);
  CHECK(sup->terminate_child("nope").code() == ErrorCode::not_found);
}

TEST_CASE("trees nest to any depth and stop deepest-last-started first", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  {
    troupe::Runtime rt;
    troupe::SupervisorSpec leaf{.children = {probe(j, "x"), probe(j, "y")}};
    troupe::SupervisorSpec level2{.children = {probe(j, "m"), troupe::supervisor("leaf", leaf)}};
    auto top = rt.start_supervisor("top", {.children = {troupe::supervisor("level2", level2), probe(j, "z")}});
    REQUIRE(top.has_value());
    CHECK(j->lines() == std::vector<std::string>{"start m", "start x", "start y", "start z"});
    auto leaf_ref = troupe::SupervisorRef(troupe::SupervisorRef(top->child_ref("level2").value()).child_ref("leaf").value());
    CHECK(leaf_ref.child<Probe>("y").value().path() == "/top/level2/leaf/y");
  }
  CHECK(starting_with(j->lines(), "stop") ==
        std::vector<std::string>{"stop z shutdown", "stop y shutdown", "stop x shutdown", "stop m shutdown"});
}

TEST_CASE("Runtime::stop on a supervised child is an exit its supervisor handles", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  troupe::Runtime rt;
  auto sup = rt.start_supervisor("s", {.intensity = 5, .children = {probe(j, "p"), probe(j, "t", Restart::transient)}});
  REQUIRE(sup.has_value());
  auto p = child(*sup, "p");
  rt.stop(p);
  REQUIRE(p.ask(Total{}).get().has_value());
  CHECK(j->count("start p") == 2);
  auto t = child(*sup, "t");
  auto t_down = rt.monitor(t);
  rt.stop(t);
  REQUIRE(t_down.get().has_value());
  auto kids = sup->which_children().value();
  CHECK(kids[0].running);
  CHECK_FALSE(kids[1].running);
}

namespace {
// Comes back poisoned after its first crash: every restart then fails in on_start.
struct Poison {};
class Fragile : public troupe::Actor<Fragile, Poison, Total> {
 public:
  explicit Fragile(JournalPtr j) : j_(std::move(j)) {}
  void on_start() override {
    j_->add("start fragile");
    if (poisoned_) throw std::runtime_error("poisoned state");
  }
  void handle(const Poison&) {
    poisoned_ = true;
    checkpoint();
    throw std::runtime_error("took poison");
  }
  int handle(const Total&) { return 0; }
  std::optional<std::string> snapshot() override { return poisoned_ ? "poisoned" : "fine"; }
  void restore(std::string_view s) override { poisoned_ = s == "poisoned"; }

 private:
  JournalPtr j_;
  bool poisoned_ = false;
};
}  // namespace

TEST_CASE("a restart that fails in on_start is retried, counted, and escalates past the intensity", "[supervisor]") {
  auto j = std::make_shared<Journal>();
  auto reports = std::make_shared<Journal>();
  troupe::Runtime rt(config_with_reports(reports));
  auto sup = rt.start_supervisor("s", {.intensity = 3, .period = 10s,
                                       .children = {troupe::worker<Fragile>("f", j)}});
  REQUIRE(sup.has_value());
  auto down = rt.monitor(sup->ref());
  auto f = sup->child<Fragile>("f").value();
  REQUIRE(f.tell(Poison{}).ok());
  auto reason = down.get();
  REQUIRE(reason.has_value());
  CHECK_THAT(reason->message, Catch::Contains("max restart intensity"));
  // First start, then three restarts that each fail in on_start.
  CHECK(j->count("start fragile") == 4);
  auto lines = reports->lines();
  REQUIRE(lines.size() == 5);
  CHECK(lines[3] == "/s/f escalate");
  CHECK(lines[4] == "/s terminate");
}
