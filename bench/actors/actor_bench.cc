// Actor-core benchmarks. Every measurement runs the same work on raw CAF
// 0.17.6 (same scheduler settings and thread count) in the same process and
// prints troupe / raw. Rounds alternate raw and troupe; medians are reported.
//
//   ask round trip between two actors (request(...).then vs ask(...).then)
//   ask from a plain thread, blocking (scoped_actor receive vs Future::get)
//   tell throughput 1 -> 1 and 4 -> 4 (anon_send vs ActorRef::tell)
//   spawn rate, 100k actors
//   supervised restart: crash -> the new incarnation answers an ask
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>

#include "../common/report.h"
#include "../common/sampler.h"
#include "troupe/troupe.h"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using troupe::bench::emit;
using troupe::bench::quantile;
using troupe::bench::us_between;
using troupe::bench::RunSamples;
using troupe::bench::SampleLoop;
using troupe::bench::Sampler;

namespace {

constexpr size_t kThreads = 2;

void configure_caf(caf::actor_system_config& cfg) {
  // The same settings troupe's runtime applies to its own CAF system.
  cfg.set("scheduler.max-threads", static_cast<int64_t>(kThreads));
  cfg.set("work-stealing.moderate-sleep-duration", caf::timespan(std::chrono::microseconds(5)));
}

troupe::RuntimeConfig troupe_config() {
  troupe::RuntimeConfig cfg;
  cfg.threads = kThreads;
  cfg.log_level = "off";  // the restart benchmark crashes on purpose, 10^4 times
  return cfg;
}

double median(std::vector<double> v) { return quantile(v, 0.5); }

using get_atom = caf::atom_constant<caf::atom("get")>;
using crash_atom = caf::atom_constant<caf::atom("crash")>;

// ---------------------------------------------------------------------------
// ask round trip between two actors

struct LatencyResult {
  double p50_us, p99_us;
};

/// A raw CAF actor that runs a SampleLoop and hands the samples to `out`.
class RawSampler : public caf::event_based_actor {
 public:
  RawSampler(caf::actor_config& cfg, int n, std::promise<std::vector<double>>* out) : caf::event_based_actor(cfg) {
    loop_.reset(n, [this, out](std::vector<double> s) {
      out->set_value(std::move(s));
      quit();
    });
  }
  caf::behavior make_behavior() override {
    next();
    return {[](int) {}};
  }

 protected:
  virtual void next() = 0;
  SampleLoop loop_;
};

class RawPinger : public RawSampler {
 public:
  RawPinger(caf::actor_config& cfg, caf::actor to, int n, std::promise<std::vector<double>>* out)
      : RawSampler(cfg, n, out), to_(std::move(to)) {}

 private:
  void next() override {
    loop_.next([this] {
      request(to_, caf::infinite, 1).then([this](int) {
        loop_.record();
        next();
      });
    });
  }
  caf::actor to_;
};

LatencyResult raw_ask_rtt(int n) {
  caf::actor_system_config cfg;
  configure_caf(cfg);
  caf::actor_system sys{cfg};
  auto ponger = sys.spawn([]() -> caf::behavior { return {[](int x) { return x; }}; });
  std::promise<std::vector<double>> done;
  auto fut = done.get_future();
  sys.spawn<RawPinger>(ponger, n, &done);
  auto samples = fut.get();
  caf::anon_send_exit(ponger, caf::exit_reason::user_shutdown);
  return {quantile(samples, 0.5), quantile(samples, 0.99)};
}

struct Ping {
  int n;
};
class Ponger : public troupe::Actor<Ponger, Ping> {
 public:
  int handle(const Ping& p) { return p.n; }
};
class Pinger : public Sampler<Pinger, Ponger> {
 public:
  void next() {
    loop_.next([this] {
      ask(to_, Ping{1}).then([this](troupe::Result<int>) {
        loop_.record();
        next();
      });
    });
  }
};

LatencyResult troupe_ask_rtt(int n) {
  troupe::Runtime rt(troupe_config());
  auto ponger = rt.spawn<Ponger>();
  auto pinger = rt.spawn<Pinger>();
  auto samples = pinger.ask(RunSamples<Ponger>{ponger, n}, 600s).get().value();
  return {quantile(samples, 0.5), quantile(samples, 0.99)};
}

// ---------------------------------------------------------------------------
// blocking ask from a plain thread

LatencyResult raw_blocking_ask(int n) {
  caf::actor_system_config cfg;
  configure_caf(cfg);
  caf::actor_system sys{cfg};
  auto ponger = sys.spawn([]() -> caf::behavior { return {[](int x) { return x; }}; });
  caf::scoped_actor self{sys};
  std::vector<double> samples;
  samples.reserve(n);
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    self->request(ponger, caf::infinite, i).receive([](int) {}, [](caf::error&) {});
    samples.push_back(us_between(t0, Clock::now()));
  }
  caf::anon_send_exit(ponger, caf::exit_reason::user_shutdown);
  return {quantile(samples, 0.5), quantile(samples, 0.99)};
}

LatencyResult troupe_blocking_ask(int n) {
  troupe::Runtime rt(troupe_config());
  auto ponger = rt.spawn<Ponger>();
  std::vector<double> samples;
  samples.reserve(n);
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    (void)ponger.ask(Ping{i}).get();
    samples.push_back(us_between(t0, Clock::now()));
  }
  return {quantile(samples, 0.5), quantile(samples, 0.99)};
}

// ---------------------------------------------------------------------------
// tell throughput: `pairs` sender threads, each to its own receiving actor

struct Tick {
  int v;
};
class Sink : public troupe::Actor<Sink, Tick> {
 public:
  Sink(int64_t target, std::shared_ptr<std::promise<void>> done) : target_(target), done_(std::move(done)) {}
  void handle(const Tick&) {
    if (++n_ == target_) done_->set_value();
  }

 private:
  int64_t target_;
  int64_t n_ = 0;
  std::shared_ptr<std::promise<void>> done_;
};

// `bound` 0 keeps the runtime's default mailbox bound.
double troupe_tell_rate(int pairs, int64_t per_pair, size_t bound, int64_t* refused) {
  troupe::Runtime rt(troupe_config());
  std::vector<troupe::ActorRef<Sink>> sinks;
  std::vector<std::future<void>> done;
  for (int p = 0; p < pairs; ++p) {
    auto pr = std::make_shared<std::promise<void>>();
    done.push_back(pr->get_future());
    sinks.push_back(rt.spawn_with<Sink>({.mailbox_bound = bound}, per_pair, pr));
  }
  std::atomic<int64_t> full{0};
  auto t0 = Clock::now();
  std::vector<std::thread> senders;
  for (int p = 0; p < pairs; ++p) {
    senders.emplace_back([&, p] {
      for (int64_t i = 0; i < per_pair; ++i) {
        // A full mailbox pushes back: back off and retry (counted). Sleeping,
        // not spinning, leaves the cores to the actors that drain it.
        while (sinks[p].tell(Tick{static_cast<int>(i)}).code() == troupe::ErrorCode::mailbox_full) {
          full.fetch_add(1, std::memory_order_relaxed);
          std::this_thread::sleep_for(20us);
        }
      }
    });
  }
  for (auto& t : senders) t.join();
  for (auto& d : done) d.get();
  double secs = troupe::bench::seconds_since(t0);
  *refused += full.load();
  return static_cast<double>(pairs * per_pair) / secs;
}

double raw_tell_rate(int pairs, int64_t per_pair) {
  caf::actor_system_config cfg;
  configure_caf(cfg);
  caf::actor_system sys{cfg};
  std::vector<caf::actor> sinks;
  std::vector<std::future<void>> done;
  for (int p = 0; p < pairs; ++p) {
    auto pr = std::make_shared<std::promise<void>>();
    done.push_back(pr->get_future());
    sinks.push_back(sys.spawn([per_pair, pr]() -> caf::behavior {
      auto n = std::make_shared<int64_t>(0);
      return {[=](int) {
        if (++*n == per_pair) pr->set_value();
      }};
    }));
  }
  auto t0 = Clock::now();
  std::vector<std::thread> senders;
  for (int p = 0; p < pairs; ++p) {
    senders.emplace_back([&, p] {
      for (int64_t i = 0; i < per_pair; ++i) caf::anon_send(sinks[p], static_cast<int>(i));
    });
  }
  for (auto& t : senders) t.join();
  for (auto& d : done) d.get();
  double secs = troupe::bench::seconds_since(t0);
  for (auto& s : sinks) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  return static_cast<double>(pairs * per_pair) / secs;
}

// ---------------------------------------------------------------------------
// spawn rate: time until `n` actors have run their start hook

class Idle : public troupe::Actor<Idle, Ping> {
 public:
  explicit Idle(std::atomic<int>* started) : started_(started) {}
  void on_start() override { started_->fetch_add(1, std::memory_order_relaxed); }
  int handle(const Ping& p) { return p.n; }

 private:
  std::atomic<int>* started_;
};

class RawIdle : public caf::event_based_actor {
 public:
  RawIdle(caf::actor_config& cfg, std::atomic<int>* started) : caf::event_based_actor(cfg), started_(started) {}
  caf::behavior make_behavior() override {
    started_->fetch_add(1, std::memory_order_relaxed);
    return {[](int x) { return x; }};
  }

 private:
  std::atomic<int>* started_;
};

void wait_count(const std::atomic<int>& c, int n) {
  while (c.load(std::memory_order_relaxed) < n) std::this_thread::yield();
}

double troupe_spawn_rate(int n) {
  troupe::Runtime rt(troupe_config());
  std::atomic<int> started{0};
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) (void)rt.spawn<Idle>(&started);
  wait_count(started, n);
  double secs = troupe::bench::seconds_since(t0);
  return n / secs;
}

double raw_spawn_rate(int n) {
  caf::actor_system_config cfg;
  configure_caf(cfg);
  caf::actor_system sys{cfg};
  std::atomic<int> started{0};
  std::vector<caf::actor> actors;
  actors.reserve(n);
  auto t0 = Clock::now();
  // Raw CAF actors live while a handle exists; keeping the handles is the
  // equivalent of troupe's registry keeping unsupervised actors alive.
  for (int i = 0; i < n; ++i) actors.push_back(sys.spawn<RawIdle>(&started));
  wait_count(started, n);
  double secs = troupe::bench::seconds_since(t0);
  for (auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  return n / secs;
}

// ---------------------------------------------------------------------------
// supervised restart: crash -> the new incarnation answers an ask

struct Crash {};
struct Get {};
class Worker : public troupe::Actor<Worker, Crash, Get> {
 public:
  void handle(const Crash&) { throw std::runtime_error("benchmark crash"); }
  int handle(const Get&) { return 7; }
};
class Crasher : public Sampler<Crasher, Worker> {
 public:
  void next() {
    loop_.next([this] {
      (void)to_.tell(Crash{});
      ask(to_, Get{}).then([this](troupe::Result<int> r) {
        if (!r) throw std::runtime_error("restart benchmark: ask failed: " + r.error().to_string());
        loop_.record();
        next();
      });
    });
  }
};

LatencyResult troupe_restart(int n) {
  troupe::Runtime rt(troupe_config());
  auto sup = rt.start_supervisor(
      "bench", {.intensity = 1'000'000'000, .period = 1000ms, .children = {troupe::worker<Worker>("w")}});
  auto w = sup.value().child<Worker>("w").value();
  auto crasher = rt.spawn<Crasher>();
  auto samples = crasher.ask(RunSamples<Worker>{w, n}, 600s).get().value();
  return {quantile(samples, 0.5), quantile(samples, 0.99)};
}

// Raw CAF: a manager monitors the worker, respawns it when it dies, and
// forwards gets (stashing them while no worker runs). A get that reaches a
// dying worker bounces, and the client asks again: that is what a raw CAF
// program without supervision has to do.
class RawManager : public caf::event_based_actor {
 public:
  explicit RawManager(caf::actor_config& cfg) : caf::event_based_actor(cfg) {}
  caf::behavior make_behavior() override {
    set_down_handler([this](caf::down_msg&) {
      respawn();
      for (auto& rp : pending_) rp.delegate(worker_, get_atom::value);
      pending_.clear();
    });
    respawn();
    return {
        [this](crash_atom) { send(worker_, crash_atom::value); },
        [this](get_atom) -> caf::result<caf::message> {
          if (!worker_) {
            pending_.push_back(make_response_promise());
            return caf::delegated<caf::message>{};
          }
          return delegate(worker_, get_atom::value);
        },
    };
  }

 private:
  void respawn() {
    worker_ = spawn([](caf::event_based_actor* self) -> caf::behavior {
      return {[self](crash_atom) { self->quit(caf::sec::runtime_error); }, [](get_atom) { return 7; }};
    });
    monitor(worker_);
  }
  caf::actor worker_;
  std::vector<caf::response_promise> pending_;
};

class RawCrasher : public RawSampler {
 public:
  RawCrasher(caf::actor_config& cfg, caf::actor mgr, int n, std::promise<std::vector<double>>* out)
      : RawSampler(cfg, n, out), mgr_(std::move(mgr)) {}

 private:
  void next() override {
    loop_.next([this] {
      send(mgr_, crash_atom::value);
      get();
    });
  }
  void get() {
    request(mgr_, caf::infinite, get_atom::value)
        .then(
            [this](int) {
              loop_.record();
              next();
            },
            [this](caf::error&) { get(); });
  }
  caf::actor mgr_;
};

LatencyResult raw_restart(int n) {
  caf::actor_system_config cfg;
  configure_caf(cfg);
  caf::actor_system sys{cfg};
  auto mgr = sys.spawn<RawManager>();
  std::promise<std::vector<double>> done;
  auto fut = done.get_future();
  sys.spawn<RawCrasher>(mgr, n, &done);
  auto samples = fut.get();
  caf::anon_send_exit(mgr, caf::exit_reason::user_shutdown);
  return {quantile(samples, 0.5), quantile(samples, 0.99)};
}

template <class Raw, class Troupe>
void latency_bench(const char* name, int rounds, Raw raw, Troupe tr, const char* target_p50, const char* baseline) {
  std::vector<double> r50, r99, t50, t99;
  for (int i = 0; i < rounds; ++i) {
    auto r = raw();
    auto t = tr();
    r50.push_back(r.p50_us);
    r99.push_back(r.p99_us);
    t50.push_back(t.p50_us);
    t99.push_back(t.p99_us);
  }
  emit(name, "p50", median(t50), "us", baseline, median(r50), target_p50);
  emit(name, "p99", median(t99), "us", baseline, median(r99), "report");
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = troupe::bench::quick(argc, argv);
  int rounds = quick ? 1 : 3;

  int pings = quick ? 20'000 : 200'000;
  latency_bench("actors.ask_rtt", rounds, [&] { return raw_ask_rtt(pings); }, [&] { return troupe_ask_rtt(pings); },
                "ratio <= 1.5", "raw CAF request(...).then, 2 threads");

  int blocking = quick ? 5'000 : 50'000;
  latency_bench("actors.ask_blocking", rounds, [&] { return raw_blocking_ask(blocking); },
                [&] { return troupe_blocking_ask(blocking); }, "report",
                "raw CAF scoped_actor request(...).receive");

  for (int pairs : {1, 4}) {
    int64_t per_pair = (quick ? 500'000 : 4'000'000) / pairs;
    std::vector<double> raw, tr;
    int64_t refused = 0;
    for (int i = 0; i < rounds; ++i) {
      raw.push_back(raw_tell_rate(pairs, per_pair));
      // Raw CAF mailboxes are unbounded: compare with a bound the burst never reaches.
      tr.push_back(troupe_tell_rate(pairs, per_pair, static_cast<size_t>(per_pair) + 1, &refused));
    }
    std::string name = "actors.tell_throughput_" + std::to_string(pairs) + "to" + std::to_string(pairs);
    emit(name, "messages_per_s", median(tr), "msg/s", "raw CAF anon_send to an event_based_actor", median(raw),
         "ratio >= 0.7");
  }
  {
    // The same 1 -> 1 burst into the default bound (10^6): the sender is
    // pushed back and retries. Raw CAF has no bound to compare with; its
    // unbounded figure is the baseline.
    int64_t burst = quick ? 500'000 : 4'000'000;
    std::vector<double> raw, tr;
    int64_t refused = 0;
    for (int i = 0; i < rounds; ++i) {
      raw.push_back(raw_tell_rate(1, burst));
      tr.push_back(troupe_tell_rate(1, burst, 0, &refused));
    }
    emit("actors.tell_backpressure_1to1", "messages_per_s", median(tr), "msg/s",
         "raw CAF anon_send, unbounded mailbox", median(raw), "report");
    std::printf("{\"bench\": \"actors.tell_backpressure_1to1\", \"metric\": \"mailbox_full_retries\", "
                "\"value\": %lld, \"unit\": \"count\"}\n",
                static_cast<long long>(refused / rounds));
  }

  int spawns = quick ? 20'000 : 100'000;
  {
    std::vector<double> raw, tr;
    for (int i = 0; i < rounds; ++i) {
      raw.push_back(raw_spawn_rate(spawns));
      tr.push_back(troupe_spawn_rate(spawns));
    }
    emit("actors.spawn_rate", "actors_per_s", median(tr), "actors/s",
         "raw CAF spawn<event_based_actor> (Ray: ~550 actors/s cluster-wide)", median(raw), "value >= 100000");
  }

  int crashes = quick ? 2'000 : 20'000;
  latency_bench("actors.supervised_restart", rounds, [&] { return raw_restart(crashes); },
                [&] { return troupe_restart(crashes); }, "value <= 100 us",
                "raw CAF monitor + respawn + retry");
  return 0;
}
