// The actor API: tell/ask, ordering, errors as values, in-actor asks, timers,
// monitors, links, deferred replies, bounds.
#include <atomic>
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
using troupe::test::Journal;
using troupe::test::JournalPtr;

namespace {

struct Add {
  int n;
};
struct Get {};
struct Boom {
  std::string why;
};
struct Sleep {
  std::chrono::milliseconds d;
};
struct Halt {};

class Counter : public troupe::Actor<Counter, Add, Get, Boom, Sleep, Halt> {
 public:
  void handle(const Add& m) { total_ += m.n; }
  int handle(const Get&) { return total_; }
  int handle(const Boom& b) { throw std::runtime_error(b.why); }
  // Blocks its scheduler thread on purpose: only used to provoke timeouts.
  void handle(const Sleep& s) { std::this_thread::sleep_for(s.d); }
  void handle(const Halt&) { stop(); }

 private:
  int total_ = 0;
};

// FIFO check: remembers the last sequence number seen per sender.
struct Seq {
  int sender;
  int n;
};
struct Violations {};
class OrderChecker : public troupe::Actor<OrderChecker, Seq, Violations> {
 public:
  void handle(const Seq& s) {
    if (last_.size() <= static_cast<size_t>(s.sender)) last_.resize(s.sender + 1, -1);
    if (s.n != last_[s.sender] + 1) ++violations_;
    last_[s.sender] = s.n;
    ++received_;
  }
  std::pair<int, int> handle(const Violations&) { return {violations_, received_}; }

 private:
  std::vector<int> last_;
  int violations_ = 0;
  int received_ = 0;
};

// Asks another actor from inside a handler and answers later.
struct Relay {
  troupe::ActorRef<Counter> to;
  std::chrono::milliseconds timeout;
};
class Relayer : public troupe::Actor<Relayer, Relay> {
 public:
  troupe::Deferred<int> handle(const Relay& r) {
    auto reply = defer<int>();
    ask(r.to, Get{}, r.timeout).then([reply](troupe::Result<int> v) mutable {
      if (v) {
        reply.complete(*v * 10);
      } else {
        reply.fail(v.error());
      }
    });
    return reply;
  }
};

struct TryBlock {
  troupe::ActorRef<Counter> to;
};
class Blocker : public troupe::Actor<Blocker, TryBlock> {
 public:
  troupe::Result<int> handle(const TryBlock& m) { return m.to.ask(Get{}).get(); }
};

struct Watch {
  troupe::AnyRef who;
};
struct LinkTo {
  troupe::AnyRef who;
};
struct SetTimer {
  std::chrono::milliseconds after;
  bool cancel;
};
class Watcher : public troupe::Actor<Watcher, Watch, LinkTo, SetTimer> {
 public:
  explicit Watcher(JournalPtr j) : j_(std::move(j)) {}
  void handle(const Watch& w) {
    monitor(w.who, [this](const troupe::Down& d) { j_->add("down " + d.reason.to_string()); });
  }
  void handle(const LinkTo& l) { link(l.who); }
  void handle(const SetTimer& t) {
    auto id = after(t.after, [this] { j_->add("timer"); });
    if (t.cancel) cancel(id);
    after(t.after + 5ms, [this] { j_->add("timer2"); });
  }
  void on_stop(const troupe::ExitReason& r) override { j_->add("watcher stopped " + r.to_string()); }

 private:
  JournalPtr j_;
};

class TrappingWatcher : public troupe::Actor<TrappingWatcher, LinkTo> {
 public:
  explicit TrappingWatcher(JournalPtr j) : j_(std::move(j)) {}
  void handle(const LinkTo& l) { link(l.who); }
  void on_link_exit(const troupe::LinkExit& e) override { j_->add("trapped " + e.reason.to_string()); }

 private:
  JournalPtr j_;
};

struct Unknown {};

}  // namespace

TEST_CASE("ask returns the handler's value and tell is processed in order", "[actors]") {
  troupe::Runtime rt;
  auto c = rt.spawn<Counter>();
  for (int i = 1; i <= 100; ++i) REQUIRE(c.tell(Add{i}).ok());
  auto r = c.ask(Get{}).get();
  REQUIRE(r.has_value());
  CHECK(*r == 5050);
}

TEST_CASE("messages from concurrent senders arrive in per-sender FIFO order", "[actors]") {
  troupe::Runtime rt;
  auto checker = rt.spawn<OrderChecker>();
  constexpr int kSenders = 4, kPerSender = 20000;
  std::atomic<int> refused{0};  // Catch2 assertions are not thread-safe: count here, check below
  std::vector<std::thread> senders;
  for (int s = 0; s < kSenders; ++s) {
    senders.emplace_back([&, s] {
      for (int n = 0; n < kPerSender; ++n) {
        if (!checker.tell(Seq{s, n}).ok()) refused.fetch_add(1);
      }
    });
  }
  for (auto& t : senders) t.join();
  REQUIRE(refused.load() == 0);
  // Generous: under TSan each of these messages costs milliseconds.
  auto r = checker.ask(Violations{}, 300s).get();
  REQUIRE(r.has_value());
  CHECK(r->first == 0);
  CHECK(r->second == kSenders * kPerSender);
}

TEST_CASE("a throwing handler fails the ask with handler_failed and the exception's message", "[actors]") {
  troupe::Runtime rt;
  auto c = rt.spawn<Counter>();
  auto r = c.ask(Boom{"disk on fire"}).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::handler_failed);
  CHECK_THAT(r.error().message(), Catch::Contains("disk on fire"));
}

TEST_CASE("an unsupervised actor that crashes is gone: later asks fail fast with actor_dead", "[actors]") {
  troupe::Runtime rt;
  auto c = rt.spawn<Counter>();
  auto down = rt.monitor(c);
  (void)c.ask(Boom{"x"}).get();
  auto reason = down.get();
  REQUIRE(reason.has_value());
  CHECK(reason->kind == troupe::ExitReason::Kind::failed);
  auto t0 = std::chrono::steady_clock::now();
  auto r = c.ask(Get{}, 10s).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::actor_dead);
  // Fails at once, not at the 10 s deadline.
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  CHECK(c.tell(Add{1}).code() == ErrorCode::actor_dead);
}

TEST_CASE("asks queued behind a stop fail with actor_dead, not a timeout", "[actors]") {
  troupe::Runtime rt;
  auto c = rt.spawn<Counter>();
  REQUIRE(c.tell(Halt{}).ok());
  auto r = c.ask(Get{}, 10s).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::actor_dead);
}

TEST_CASE("an ask times out with the timeout code when the actor does not answer in time", "[actors]") {
  troupe::Runtime rt;
  auto c = rt.spawn<Counter>();
  REQUIRE(c.tell(Sleep{300ms}).ok());
  auto r = c.ask(Get{}, 20ms).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::timeout);
}

TEST_CASE("an untyped ref reports unknown_message for a type the actor does not handle", "[actors]") {
  troupe::Runtime rt;
  troupe::AnyRef any = rt.spawn<Counter>();
  auto r = any.ask<int>(Unknown{}).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::unknown_message);
  // A known message through the untyped ref works, and the actor survived.
  auto v = any.ask<int>(Get{}).get();
  REQUIRE(v.has_value());
  CHECK(*v == 0);
  auto wrong = any.ask<std::string>(Get{}).get();
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.error().code() == ErrorCode::type_mismatch);
}

TEST_CASE("a full mailbox refuses messages with mailbox_full and keeps what it accepted", "[actors]") {
  troupe::Runtime rt;
  troupe::SpawnOptions opts;
  opts.mailbox_bound = 4;
  auto c = rt.spawn_with<Counter>(opts);
  REQUIRE(c.tell(Sleep{200ms}).ok());
  auto first = c.ask(Get{});
  int accepted = 0;
  troupe::Status last;
  for (int i = 0; i < 10; ++i) {
    last = c.tell(Add{1});
    if (last.ok()) ++accepted;
  }
  // Sleep (unless already dequeued) and Get hold slots; the rest fill up.
  CHECK(accepted >= 2);
  CHECK(accepted <= 3);
  CHECK(last.code() == ErrorCode::mailbox_full);
  CHECK_THAT(last.message(), Catch::Contains("mailbox_bound"));
  auto r1 = first.get();
  REQUIRE(r1.has_value());
  CHECK(*r1 == 0);
  auto r2 = c.ask(Get{}).get();
  REQUIRE(r2.has_value());
  CHECK(*r2 == accepted);
}

TEST_CASE("an actor asks another without blocking and answers later with a Deferred", "[actors]") {
  troupe::Runtime rt;
  auto c = rt.spawn<Counter>();
  auto relay = rt.spawn<Relayer>();
  REQUIRE(c.tell(Add{7}).ok());
  auto r = relay.ask(Relay{c, 5s}).get();
  REQUIRE(r.has_value());
  CHECK(*r == 70);
}

TEST_CASE("an ask made inside an actor times out through the actor's deadline list", "[actors]") {
  troupe::Runtime rt({.threads = 2});
  auto c = rt.spawn<Counter>();
  auto relay = rt.spawn<Relayer>();
  REQUIRE(c.tell(Sleep{300ms}).ok());
  auto r = relay.ask(Relay{c, 30ms}).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::timeout);
}

TEST_CASE("an ask from inside an actor to a dead actor fails with actor_dead", "[actors]") {
  troupe::Runtime rt;
  auto c = rt.spawn<Counter>();
  auto down = rt.monitor(c);
  REQUIRE(c.tell(Halt{}).ok());
  REQUIRE(down.get().has_value());
  auto relay = rt.spawn<Relayer>();
  auto r = relay.ask(Relay{c, 5s}).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::actor_dead);
}

TEST_CASE("blocking on a future inside a handler is refused with an error instead of a deadlock", "[actors]") {
  troupe::Runtime rt({.threads = 1});
  auto c = rt.spawn<Counter>();
  auto b = rt.spawn<Blocker>();
  auto r = b.ask(TryBlock{c}, 5s).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::invalid_argument);
  CHECK_THAT(r.error().message(), Catch::Contains("then"));
}

TEST_CASE("a monitor fires once the watched actor stops, with its reason", "[actors]") {
  troupe::Runtime rt;
  auto j = std::make_shared<Journal>();
  auto c = rt.spawn<Counter>();
  auto w = rt.spawn<Watcher>(j);
  REQUIRE(w.ask(Watch{c}).get().has_value());
  (void)c.ask(Boom{"gone"}).get();
  REQUIRE(j->wait_for("down failed: handler threw: gone"));
}

TEST_CASE("monitoring an actor that is already dead fires at once", "[actors]") {
  troupe::Runtime rt;
  auto j = std::make_shared<Journal>();
  auto c = rt.spawn<Counter>();
  auto down = rt.monitor(c);
  REQUIRE(c.tell(Halt{}).ok());
  REQUIRE(down.get().has_value());
  auto w = rt.spawn<Watcher>(j);
  REQUIRE(w.ask(Watch{c}).get().has_value());
  REQUIRE(j->wait_for("down normal"));
}

TEST_CASE("a linked actor crashes when its peer crashes, unless it handles the exit", "[actors]") {
  troupe::Runtime rt;
  auto j = std::make_shared<Journal>();
  auto c = rt.spawn<Counter>();
  auto w = rt.spawn<Watcher>(j);
  auto t = rt.spawn<TrappingWatcher>(j);
  REQUIRE(w.ask(LinkTo{c}).get().has_value());
  REQUIRE(t.ask(LinkTo{c}).get().has_value());
  auto w_down = rt.monitor(w);
  (void)c.ask(Boom{"linked"}).get();
  auto reason = w_down.get();
  REQUIRE(reason.has_value());
  CHECK(reason->kind == troupe::ExitReason::Kind::failed);
  CHECK_THAT(reason->message, Catch::Contains("linked actor"));
  REQUIRE(j->wait_for("trapped failed: handler threw: linked"));
  // The trapping actor is still alive.
  CHECK(rt.live_actors() >= 1);
}

TEST_CASE("a normal exit does not propagate through a link", "[actors]") {
  troupe::Runtime rt;
  auto j = std::make_shared<Journal>();
  auto c = rt.spawn<Counter>();
  auto w = rt.spawn<Watcher>(j);
  REQUIRE(w.ask(LinkTo{c}).get().has_value());
  REQUIRE(w.ask(Watch{c}).get().has_value());
  REQUIRE(c.tell(Halt{}).ok());
  REQUIRE(j->wait_for("down normal"));
  // The watcher processed the down after any link exit would have arrived.
  CHECK(j->count("watcher stopped failed: linked actor " + c.path() + " exited: normal") == 0);
  auto still = w.ask(Watch{c}).get();
  CHECK(still.has_value());
}

TEST_CASE("timers run on the actor and a cancelled timer never runs", "[actors]") {
  troupe::Runtime rt;
  auto j = std::make_shared<Journal>();
  auto w = rt.spawn<Watcher>(j);
  REQUIRE(w.ask(SetTimer{10ms, true}).get().has_value());
  REQUIRE(j->wait_for("timer2"));
  CHECK(j->count("timer") == 0);
  REQUIRE(w.ask(SetTimer{1ms, false}).get().has_value());
  REQUIRE(j->wait_for("timer"));
}

TEST_CASE("refs compare by identity, hash, and an empty ref fails with actor_dead", "[actors]") {
  troupe::Runtime rt;
  auto a = rt.spawn<Counter>();
  auto b = rt.spawn<Counter>();
  auto a2 = a;
  CHECK(a == a2);
  CHECK_FALSE(a == b);
  CHECK(std::hash<troupe::ActorRef<Counter>>()(a) == std::hash<troupe::ActorRef<Counter>>()(a2));
  CHECK(a.id() != b.id());
  troupe::ActorRef<Counter> empty;
  CHECK(empty.tell(Add{1}).code() == ErrorCode::actor_dead);
  auto r = empty.ask(Get{}).get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::actor_dead);
  auto typed = troupe::ActorRef<OrderChecker>::from(a);
  REQUIRE_FALSE(typed.has_value());
  CHECK(typed.error().code() == ErrorCode::type_mismatch);
  CHECK(troupe::ActorRef<Counter>::from(a.untyped()).value() == a);
}

TEST_CASE("named actors get their name as path", "[actors]") {
  troupe::Runtime rt;
  auto a = rt.spawn_with<Counter>({.name = "counter"});
  CHECK(a.path() == "/counter");
}
