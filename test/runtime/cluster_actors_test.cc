// Actors on the cluster, with real processes: workers that node agents start
// from this test executable, placement by resources, bundles and labels,
// restarts from snapshots after kill -9 of a worker or an agent, named
// get-or-create, and owned actors stopping with their driver.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "support/local_cluster.h"
#include "support/test_driver.h"
#include "troupe/detail/fault_points.h"
#include "troupe/init.h"
#include "troupe/remote_child.h"

using namespace std::chrono_literals;
using troupe::ErrorCode;
using namespace troupe::test;

namespace {

struct Add {
  int n = 0;
  TROUPE_MESSAGE_NAMED(Add, "test.cluster.Add", n);
};
struct Total {
  TROUPE_MESSAGE_NAMED(Total, "test.cluster.Total");
};
struct Pid {
  TROUPE_MESSAGE_NAMED(Pid, "test.cluster.Pid");
};
struct Crash {
  TROUPE_MESSAGE_NAMED(Crash, "test.cluster.Crash");
};
struct Tag {
  TROUPE_MESSAGE_NAMED(Tag, "test.cluster.Tag");
};
/// Works for `ms` (in the worker) before it adds: a kill during that time
/// catches the ask in flight.
struct SlowAdd {
  int n = 0;
  int ms = 0;
  TROUPE_MESSAGE_NAMED(SlowAdd, "test.cluster.SlowAdd", n, ms);
};

/// A counter that snapshots after every change, so that a restart anywhere
/// comes back with its total.
class Counter : public troupe::Actor<Counter, Add, Total, Pid, Crash, Tag, SlowAdd> {
 public:
  Counter(int start, std::string tag) : total_(start), tag_(std::move(tag)) {}
  int handle(const Add& m) {
    total_ += m.n;
    checkpoint();
    return total_;
  }
  int handle(const Total&) { return total_; }
  int64_t handle(const Pid&) { return getpid(); }
  void handle(const Crash&) { fail("asked to crash"); }
  std::string handle(const Tag&) { return tag_; }
  int handle(const SlowAdd& m) {
    std::this_thread::sleep_for(std::chrono::milliseconds(m.ms));  // the work a kill interrupts
    return handle(Add{m.n});
  }

  std::optional<std::string> snapshot() override { return std::to_string(total_); }
  void restore(std::string_view bytes) override { total_ = std::stoi(std::string(bytes)); }

 private:
  int total_;
  std::string tag_;
};

/// An actor whose constructor refuses its argument (a config its process
/// cannot run, say).
class Picky : public troupe::Actor<Picky, Total> {
 public:
  explicit Picky(std::string what) {
    if (what != "fine") throw std::runtime_error("picky: cannot run '" + what + "' here");
  }
  int handle(const Total&) { return 1; }
};

/// An actor that starts, but cannot start again once `marker` exists (what
/// it needs went away while it ran).
class Fragile : public troupe::Actor<Fragile, Total, Crash> {
 public:
  explicit Fragile(std::string marker) {
    if (std::filesystem::exists(marker)) throw std::runtime_error("fragile: cannot start now");
  }
  int handle(const Total&) { return 1; }
  void handle(const Crash&) { fail("asked to crash"); }
};

/// Polls the head until it no longer lists the actor as living (its answer
/// is then the error saying why), or `within` passes (the last record).
troupe::Result<troupe::ActorInfo> dead_for_good(const troupe::ClusterClient& c, const std::string& id,
                                                std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    auto info = c.actor(id);
    if (!info || std::chrono::steady_clock::now() > deadline) return info;
    std::this_thread::sleep_for(10ms);  // polling the head
  }
}

/// Polls the head until the actor is alive again (after a restart) and
/// returns its record; the head answers as soon as it is.
troupe::ActorInfo alive_again(const troupe::ClusterClient& c, const std::string& id, uint32_t restarts) {
  auto deadline = std::chrono::steady_clock::now() + 20s;
  for (;;) {
    auto info = c.actor(id, 5s);
    if (info && info->state == "alive" && info->restarts >= restarts) return *info;
    if (std::chrono::steady_clock::now() > deadline) {
      FAIL("actor " << id << " not back: " << (info ? info->state + " " + info->reason : info.error().message()));
    }
    std::this_thread::sleep_for(10ms);  // the old incarnation may still be listed alive for a moment
  }
}

/// A fault point (troupe/detail/fault_points.h) that the first thread to
/// reach it for `address` signals, and, with `hold`, waits at until
/// release() (bounded: 10 s). The hook goes with this object; what the hook
/// touches is shared with it, so a thread still leaving it is safe.
class FaultPointGate {
 public:
  FaultPointGate(troupe::detail::faults::Point point, std::string address, bool hold)
      : point_(point), shared_(std::make_shared<Shared>()) {
    reached_ = shared_->reached.get_future();
    shared_->released = release_.get_future().share();
    troupe::detail::faults::set(point_, [shared = shared_, address = std::move(address), hold](const std::string& at) {
      if (at != address || shared->taken.exchange(true)) return;
      shared->reached.set_value();
      if (hold) (void)shared->released.wait_for(10s);
    });
  }
  ~FaultPointGate() {
    troupe::detail::faults::set(point_, {});
    release();
  }
  FaultPointGate(const FaultPointGate&) = delete;
  FaultPointGate& operator=(const FaultPointGate&) = delete;
  /// Whether a thread reached the point within `timeout`.
  bool reached_within(std::chrono::milliseconds timeout) {
    return reached_.wait_for(timeout) == std::future_status::ready;
  }
  /// Lets the held thread go on.
  void release() {
    if (!released_.exchange(true)) release_.set_value();
  }

 private:
  struct Shared {
    std::promise<void> reached;
    std::shared_future<void> released;
    std::atomic<bool> taken{false};
  };
  troupe::detail::faults::Point point_;
  std::shared_ptr<Shared> shared_;
  std::future<void> reached_;
  std::promise<void> release_;
  std::atomic<bool> released_{false};
};

}  // namespace

TEST_CASE("cluster actors: spawn runs an actor in a worker process started by an agent, asks reach it",
          "[cluster][actors]") {
  LocalCluster local(2);
  auto& cluster = local.cluster;
  auto info = cluster.spawn_info<Counter>({}, 5, "first");
  INFO((info ? std::string("ok") : info.error().message()));
  REQUIRE(info.has_value());
  CHECK(info->state == "alive");
  CHECK((info->node == "a1" || info->node == "a2"));
  auto counter = cluster.ref_to<Counter>(*info).value();
  CHECK(counter.ask(Add{3}).get().value() == 8);
  CHECK(counter.ask(Tag{}).get().value() == "first");  // a string literal travelled as std::string
  int64_t pid = counter.ask(Pid{}).get().value();
  CHECK(pid != getpid());

  // More actors spread over both nodes; actors of one program share the
  // node's worker process unless they ask for their own.
  std::set<std::string> nodes;
  std::set<int64_t> pids;
  for (int i = 0; i < 4; ++i) {
    auto more = cluster.spawn_info<Counter>({}, i, "more");
    REQUIRE(more.has_value());
    nodes.insert(more->node);
    pids.insert(cluster.ref_to<Counter>(*more).value().ask(Pid{}).get().value());
  }
  CHECK(nodes.size() == 2);
  CHECK(pids.size() == 2);
  auto own_info = cluster.spawn_info<Counter>({.dedicated_process = true}, 0, "own").value();
  auto own = cluster.ref_to<Counter>(own_info).value();
  int64_t own_pid = own.ask(Pid{}).get().value();
  CHECK(pids.count(own_pid) == 0);
  // A process of its own ends with its actor (the agent reaps it).
  REQUIRE(cluster.kill_actor(own_info.id).ok());
  bool reaped = false;
  for (int i = 0; i < 500 && !reaped; ++i) {
    reaped = ::kill(static_cast<pid_t>(own_pid), 0) == -1 && errno == ESRCH;
    if (!reaped) std::this_thread::sleep_for(10ms);  // polling another process's end
  }
  CHECK(reaped);

  auto listed = cluster.list_actors().value();
  CHECK(listed.size() == 6);  // five alive, and the one killed
  int alive = 0;
  for (auto& a : listed) alive += a.state == "alive";
  CHECK(alive == 5);
}

TEST_CASE("cluster actors: kill -9 of its worker brings the actor back with its last snapshot", "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto info = cluster.spawn_info<Counter>({.max_restarts = -1}, 100, "state").value();
  auto counter = cluster.ref_to<Counter>(info).value();
  REQUIRE(counter.ask(Add{11}).get().value() == 111);
  int64_t pid = counter.ask(Pid{}).get().value();
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  // The old incarnation is gone: an ask to it fails rather than hangs.
  auto lost = counter.ask(Total{}, 5s).get();
  REQUIRE_FALSE(lost.has_value());
  CHECK((lost.error().code() == ErrorCode::peer_lost || lost.error().code() == ErrorCode::actor_dead));

  auto back = alive_again(cluster, info.id, 1);
  CHECK(back.restarts == 1);
  auto again = cluster.ref_to<Counter>(back).value();
  CHECK(again.ask(Total{}).get().value() == 111);
  CHECK(again.ask(Pid{}).get().value() != pid);
}

TEST_CASE("cluster actors: a crash restarts it up to max_restarts, then it is dead with the reason",
          "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto info = cluster.spawn_info<Counter>({.max_restarts = 1}, 0, "crashy").value();
  auto first = cluster.ref_to<Counter>(info).value();
  REQUIRE(first.ask(Add{4}).get().value() == 4);
  CHECK_FALSE(first.ask(Crash{}).get().has_value());
  auto back = alive_again(cluster, info.id, 1);
  auto second = cluster.ref_to<Counter>(back).value();
  CHECK(second.ask(Total{}).get().value() == 4);  // the snapshot taken before the crash
  CHECK_FALSE(second.ask(Crash{}).get().has_value());
  // Restarts used up: dead, and the head says why.
  troupe::Result<troupe::ActorInfo> gone = dead_for_good(cluster, info.id, 5s);
  REQUIRE_FALSE(gone.has_value());
  CHECK(gone.error().code() == ErrorCode::actor_dead);
  CHECK_THAT(gone.error().message(), Catch::Contains("crashed") && Catch::Contains("max_restarts"));
}

TEST_CASE("cluster actors: a constructor that throws fails the spawn with its message, and the actor is dead, not "
          "restarted",
          "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto made = cluster.spawn_info<Picky>({.max_restarts = -1}, std::string("gpu"));
  REQUIRE_FALSE(made.has_value());
  CHECK_THAT(made.error().message(), Catch::Contains("failed to start") && Catch::Contains("cannot run 'gpu' here"));
  // Dead on record with the reason (not restarting into the same throw).
  auto listed = cluster.list_actors();
  REQUIRE(listed.has_value());
  size_t restarting = 0;
  for (const auto& a : *listed) restarting += a.state == "restarting" ? 1 : 0;
  CHECK(restarting == 0);
  // The worker is unharmed: the next spawn there runs.
  auto ok = cluster.spawn<Picky>({}, std::string("fine"));
  REQUIRE(ok.has_value());
  CHECK(ok->ask(Total{}).get().value() == 1);
}

TEST_CASE("cluster actors: restarts whose constructor throws back off, count against max_restarts, then it is dead "
          "with the reason",
          "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  const std::string marker = (std::filesystem::temp_directory_path() /
                              ("troupe-fragile-" + std::to_string(getpid())))
                                 .string();
  std::filesystem::remove(marker);
  auto info = cluster.spawn_info<Fragile>({.max_restarts = 3}, marker).value();
  auto ref = cluster.ref_to<Fragile>(info).value();
  REQUIRE(ref.ask(Total{}).get().value() == 1);
  std::ofstream(marker) << "gone";
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(ref.ask(Crash{}).get().has_value());
  troupe::Result<troupe::ActorInfo> gone = dead_for_good(cluster, info.id, 20s);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::filesystem::remove(marker);
  REQUIRE_FALSE(gone.has_value());
  CHECK(gone.error().code() == ErrorCode::actor_dead);
  CHECK_THAT(gone.error().message(), Catch::Contains("cannot start now") && Catch::Contains("max_restarts"));
  // Two failed restarts waited 100 and 200 ms before the next try.
  CHECK(waited >= 0.3);
}

TEST_CASE("cluster actors: an actor waits pending with its reason until resources free up, then runs",
          "[cluster][actors]") {
  LocalCluster local(1);  // 2 CPUs
  auto& cluster = local.cluster;
  auto big = cluster.spawn_info<Counter>({.resources = {{"CPU", 2}}}, 0, "big").value();
  auto waiting = cluster.spawn_async<Counter>({.resources = {{"CPU", 1}}}, 0, "waits");
  REQUIRE(status_until(cluster, 5s, [](const troupe::ClusterStatus& st) {
    for (auto& a : st.actors) {
      if (a.state == "pending" && a.reason.find("waiting for resources") != std::string::npos) return true;
    }
    return false;
  }));
  // Asking for more than any node has is not an error: it waits as well.
  REQUIRE(cluster.kill_actor(big.id).ok());
  auto placed = waiting.get();
  REQUIRE(placed.has_value());
  CHECK(placed->state == "alive");
  CHECK(cluster.actor(big.id).error().code() == ErrorCode::actor_dead);
}

TEST_CASE("cluster actors: bundles and label selectors place actors, removing the group stops its actors",
          "[cluster][actors]") {
  LocalCluster local(0);
  auto& cluster = local.cluster;
  local.add_agent("a1", "2", "rack=r1");
  local.add_agent("a2", "2", "rack=r2");
  troupe::PlacementGroupSpec spec;
  spec.strategy = troupe::PlacementStrategy::strict_spread;
  spec.bundles.assign(2, troupe::Bundle{{{"CPU", 1}}});
  auto pg = cluster.create_placement_group(spec).value();
  auto group = cluster.wait_placement_group(pg, 10s).value();
  std::vector<troupe::ActorInfo> members;
  for (int b = 0; b < 2; ++b) {
    auto m = cluster.spawn_info<Counter>({.resources = {{"CPU", 1}}, .placement_group = pg, .bundle = b}, b, "member");
    REQUIRE(m.has_value());
    CHECK(m->node == group.bundle_nodes[b]);
    members.push_back(*m);
  }
  // The bundles are full now: a third member waits.
  auto third = cluster.spawn_async<Counter>({.resources = {{"CPU", 1}}, .placement_group = pg}, 2, "member");

  auto on_r2 = cluster.spawn_info<Counter>({.label_selector = troupe::parse_label_selector("rack=r2").value()}, 0, "r2");
  REQUIRE(on_r2.has_value());
  CHECK(on_r2->node == "a2");

  REQUIRE(cluster.remove_placement_group(pg).ok());
  for (auto& m : members) {
    auto r = cluster.actor(m.id);
    REQUIRE_FALSE(r.has_value());
    CHECK_THAT(r.error().message(), Catch::Contains("placement group"));
  }
  auto third_result = third.get();
  REQUIRE_FALSE(third_result.has_value());
  CHECK_THAT(third_result.error().message(), Catch::Contains("placement group"));
  CHECK(cluster.actor(on_r2->id).value().state == "alive");  // outside the group: untouched
}

TEST_CASE("cluster actors: named get-or-create: of racing spawns one actor is made and all get it",
          "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  constexpr int kRacers = 8;
  std::vector<troupe::Result<troupe::ActorInfo>> got(kRacers, troupe::error(ErrorCode::timeout, "not yet"));
  std::vector<std::thread> racers;
  for (int i = 0; i < kRacers; ++i) {
    racers.emplace_back([&, i] { got[i] = cluster.spawn_info<Counter>({.name = "shared", .ns = "race"}, i, "racer"); });
  }
  for (auto& t : racers) t.join();
  std::set<std::string> ids;
  for (auto& g : got) {
    REQUIRE(g.has_value());
    ids.insert(g->id);
  }
  CHECK(ids.size() == 1);
  CHECK(cluster.list_actors().value().size() == 1);
  auto by_name = cluster.get_actor_as<Counter>("shared", "race");
  REQUIRE(by_name.has_value());
  CHECK(by_name->ask(Tag{}).get().value() == "racer");
  CHECK(cluster.actor_named("shared", "race").value().id == *ids.begin());
}

TEST_CASE("cluster actors: an owned actor stops when its driver dies, a detached one lives on", "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  // A second driver: this test binary in driver mode (support/test_driver.h).
  int out[2];
  REQUIRE(pipe(out) == 0);
  int in[2];
  REQUIRE(pipe(in) == 0);
  pid_t driver_pid = fork();
  REQUIRE(driver_pid >= 0);
  if (driver_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(out[1], 1);
    dup2(in[0], 0);
    setenv("TROUPE_TEST_DRIVER_HEAD", local.head_process->address().c_str(), 1);
    setenv("TROUPE_CLUSTER_TOKEN", kToken, 1);
    execl("/proc/self/exe", "troupe_tests", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  close(in[0]);
  std::string said;
  char c;
  while (read(out[0], &c, 1) == 1 && c != '\n') said += c;
  close(out[0]);
  REQUIRE(said == "ready");
  auto owned = cluster.actor_named("owned", "owners").value();
  auto detached = cluster.actor_named("detached", "owners").value();
  CHECK(owned.state == "alive");

  ::kill(driver_pid, SIGKILL);
  waitpid(driver_pid, nullptr, 0);
  close(in[1]);
  troupe::Result<troupe::ActorInfo> after = owned;
  for (int i = 0; i < 500 && after; ++i) {
    after = cluster.actor(owned.id);
    if (after) std::this_thread::sleep_for(10ms);  // polling the head
  }
  REQUIRE_FALSE(after.has_value());
  CHECK_THAT(after.error().message(), Catch::Contains("owner"));
  auto still = cluster.actor(detached.id);
  REQUIRE(still.has_value());
  CHECK(still->state == "alive");
  auto probe = cluster.ref_to<Probe>(*still).value();
  CHECK(probe.ask(WhichProcess{}).get().has_value());
}

TEST_CASE("cluster actors: kill -9 of an agent restarts its actors on another node with their state",
          "[cluster][actors]") {
  LocalCluster local(2);
  auto& cluster = local.cluster;
  auto info = cluster.spawn_info<Counter>({.max_restarts = -1}, 0, "mover").value();
  auto counter = cluster.ref_to<Counter>(info).value();
  REQUIRE(counter.ask(Add{42}).get().value() == 42);
  Daemon& doomed = *local.agents[info.node == "a1" ? 0 : 1];
  doomed.kill9();
  auto back = alive_again(cluster, info.id, 1);
  CHECK(back.node != info.node);
  CHECK(cluster.ref_to<Counter>(back).value().ask(Total{}).get().value() == 42);
}

TEST_CASE("cluster actors: kill -9 of the head: actors keep answering, and the restarted head still restarts them",
          "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto info = cluster.spawn_info<Counter>({.name = "survivor", .max_restarts = -1}, 7, "s").value();
  auto counter = cluster.ref_to<Counter>(info).value();
  std::string address = local.head_process->address();
  local.head_process->kill9();
  CHECK(counter.ask(Add{1}).get().value() == 8);  // no head needed between actors
  local.head_process = head(local.home, address.substr(address.rfind(':') + 1));
  auto known = cluster.actor(info.id, 5s);
  REQUIRE(known.has_value());
  CHECK(known->state == "alive");
  CHECK(known->address == info.address);
  // The snapshot taken while the head was down (8) reached the new head when
  // it adopted the worker; this one (9) goes to it directly.
  CHECK(counter.ask(Add{1}).get().value() == 9);
  int64_t pid = counter.ask(Pid{}).get().value();
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  auto back = alive_again(cluster, info.id, 1);
  CHECK(cluster.ref_to<Counter>(back).value().ask(Total{}).get().value() == 9);
  CHECK(cluster.get_actor_as<Counter>("survivor").value().ask(Total{}).get().value() == 9);
}

TEST_CASE("troupe command line: list actors and status show the cluster's actors by state", "[cluster][actors]") {
  LocalCluster local(1);
  auto cli = [&](const std::string& args) {
    return troupe::test::run_command("TROUPE_HOME=" + local.home.path.string() + " TROUPE_CLUSTER_TOKEN=" + kToken +
                                     " " + TROUPE_CLI + " " + args + " --address " + local.head_process->address());
  };
  auto info = local.cluster.spawn_info<Counter>({.name = "c1"}, 1, "x").value();

  auto [code, out] = cli("list actors");
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains(info.id));
  CHECK_THAT(out, Catch::Contains("alive"));
  CHECK_THAT(out, Catch::Contains("default/c1"));

  std::tie(code, out) = cli("list actors --json");
  CHECK(code == 0);
  auto listed = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  REQUIRE(listed.is_array());
  REQUIRE(listed.size() == 1);
  CHECK(listed[0]["id"] == info.id);
  CHECK(listed[0]["state"] == "alive");
  CHECK(listed[0]["options"]["name"] == "c1");

  std::tie(code, out) = cli("status");
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("actors: 1 alive"));
}

TEST_CASE("cluster actors: the ref spawn returns follows its actor across restarts, an ask in flight fails "
          "without max_task_retries",
          "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto counter = cluster.spawn<Counter>({.max_restarts = -1}, 0, "follow").value();
  REQUIRE(counter.ask(Add{5}).get().value() == 5);
  int64_t pid = counter.ask(Pid{}).get().value();
  auto in_flight = counter.ask(SlowAdd{100, 3000});
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  auto lost = in_flight.get();
  REQUIRE_FALSE(lost.has_value());
  CHECK(lost.error().code() == ErrorCode::peer_lost);  // at most once: not retried
  // The same ref reaches the next incarnation, which has the snapshot.
  CHECK(counter.ask(Total{}).get().value() == 5);
  CHECK(counter.ask(Pid{}).get().value() != pid);
}

TEST_CASE("cluster actors: bursts of asks from several threads across a kill -9 of the worker: each thread "
          "reaches the next incarnation, and only asks in flight fail",
          "[cluster][actors]") {
  // Without max_task_retries an ask written to the old connection before it
  // broke may fail (at most once), with the lost connection as its reason.
  // Every other ask waits for the next incarnation: one sent once the
  // connection was known lost, and one that found it closed before this
  // process heard the actor was gone (it reached nothing, see
  // detail::send_unless_lost). The two tests below hold each side of that
  // window open.
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto counter = cluster.spawn<Counter>({.max_restarts = -1}, 0, "undelivered").value();
  const int64_t pid = counter.ask(Pid{}).get().value();
  constexpr int kAskers = 4;
  constexpr int kBurst = 64;
  std::mutex mu;
  std::condition_variable started;
  int asking = 0;                     // REQUIRES: mu
  std::vector<std::string> failures;  // REQUIRES: mu
  std::vector<int64_t> reached(kAskers, 0);
  std::vector<std::thread> askers;
  for (int a = 0; a < kAskers; ++a) {
    askers.emplace_back([&, a] {
      const auto deadline = std::chrono::steady_clock::now() + 30s;
      for (bool first = true; std::chrono::steady_clock::now() < deadline; first = false) {
        std::vector<troupe::Future<int64_t>> burst;
        for (int i = 0; i < kBurst; ++i) burst.push_back(counter.ask(Pid{}, 20s));
        if (first) {
          std::lock_guard<std::mutex> lock(mu);
          ++asking;
          started.notify_one();
        }
        for (auto& f : burst) {
          auto r = f.get();
          if (r && *r != pid) reached[a] = *r;
          if (!r) {
            std::lock_guard<std::mutex> lock(mu);
            failures.push_back(r.error().message());
          }
        }
        if (reached[a] != 0) return;
      }
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    started.wait(lock, [&] { return asking == kAskers; });  // every asker is sending
  }
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  for (auto& t : askers) t.join();
  for (int a = 0; a < kAskers; ++a) CHECK(reached[a] > 0);  // each reached the next incarnation
  for (const auto& f : failures) {
    INFO(f);
    CHECK_THAT(f, Catch::Contains("lost the connection"));  // in flight, never undelivered
  }
}

TEST_CASE(
    "cluster actors: asks that find the old incarnation's connection closed before this process has "
    "handled its loss wait for the next incarnation and run there, in order",
    "[cluster][actors]") {
  // The race's window (the transport refuses sends on a connection that
  // closed, and the loss is not handled yet) is held open with a fault point
  // rather than hit by luck. Before detail::send_unless_lost, the first ask
  // sent in it failed with "send: connection N is closed" (a CI failure of
  // 2026-11-26), though it never left this process.
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto info = cluster.spawn_info<Counter>({.max_restarts = -1}, 0, "window").value();
  auto counter = cluster.follow<Counter>(info).value();
  REQUIRE(counter.ask(Add{3}).get().value() == 3);
  const int64_t pid = counter.ask(Pid{}).get().value();

  FaultPointGate loss(troupe::detail::faults::Point::before_peer_lost, info.address, /*hold=*/true);
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  REQUIRE(loss.reached_within(20s));
  std::vector<troupe::Future<int>> asks;
  for (int i = 0; i < 8; ++i) asks.push_back(counter.ask(Add{1}, 30s));
  loss.release();
  for (int i = 0; i < 8; ++i) {
    auto r = asks[static_cast<size_t>(i)].get();
    INFO("ask " << i << ": " << (r ? std::string("answered") : r.error().message()));
    REQUIRE(r.has_value());
    CHECK(*r == 4 + i);  // on the snapshot (3), once each, in the order sent
  }
  CHECK(counter.ask(Pid{}).get().value() != pid);
}

TEST_CASE(
    "cluster actors: an ask registered for its answer whose frame the transport then refuses, the "
    "connection's loss handled meanwhile, waits for the next incarnation and runs there",
    "[cluster][actors]") {
  // The other side of the window above: the loss is handled while an ask,
  // already registered for its answer, has yet to reach the transport. The
  // handler leaves it to its sender; the transport refuses its frame, so it
  // never left. Before, the handler failed it as one in flight.
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto info = cluster.spawn_info<Counter>({.max_restarts = -1}, 0, "registered").value();
  auto counter = cluster.follow<Counter>(info).value();
  REQUIRE(counter.ask(Add{3}).get().value() == 3);
  const int64_t pid = counter.ask(Pid{}).get().value();

  using troupe::detail::faults::Point;
  FaultPointGate send(Point::before_ask_sent, info.address, /*hold=*/true);
  FaultPointGate loss(Point::after_peer_lost, info.address, /*hold=*/false);

  auto sender = std::async(std::launch::async, [&] { return counter.ask(Add{1}, 30s).get(); });
  REQUIRE(send.reached_within(20s));
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  REQUIRE(loss.reached_within(20s));
  send.release();
  auto r = sender.get();
  INFO((r ? std::string("answered") : r.error().message()));
  REQUIRE(r.has_value());
  CHECK(*r == 4);  // once, on the snapshot (3)
  CHECK(counter.ask(Pid{}).get().value() != pid);
}

TEST_CASE("cluster actors: with max_task_retries, asks in flight when the worker dies run on the next "
          "incarnation, in order",
          "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto counter = cluster.spawn<Counter>({.max_restarts = -1, .max_task_retries = 2}, 0, "retry").value();
  REQUIRE(counter.ask(Add{1}).get().value() == 1);
  int64_t pid = counter.ask(Pid{}).get().value();
  // Three asks in flight: the first holds the worker busy, so none has
  // answered when it dies.
  auto a = counter.ask(SlowAdd{10, 3000});
  auto b = counter.ask(Add{100});
  auto c = counter.ask(Add{1000});
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  // Each ran once, on the next incarnation, in the order sent.
  CHECK(a.get().value() == 11);
  CHECK(b.get().value() == 111);
  CHECK(c.get().value() == 1111);
  CHECK(counter.ask(Pid{}).get().value() != pid);
}

TEST_CASE("cluster actors: a ref that follows an actor fails with the reason once it is dead for good, and its "
          "monitor fires",
          "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto info = cluster.spawn_info<Counter>({}, 0, "mortal").value();
  auto counter = cluster.follow<Counter>(info).value();
  auto down = local.rt.monitor(counter, 20s);
  REQUIRE(counter.ask(Add{1}).get().value() == 1);
  int64_t pid = counter.ask(Pid{}).get().value();
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);  // max_restarts 0: dead for good
  auto reason = down.get();
  REQUIRE(reason.has_value());
  CHECK_THAT(reason->to_string(), Catch::Contains("worker process died"));
  auto after = counter.ask(Total{}).get();
  REQUIRE_FALSE(after.has_value());
  CHECK(after.error().code() == ErrorCode::actor_dead);
}

TEST_CASE("cluster actors: a supervisor's child on the cluster: its worker's or node's death is a crash the "
          "supervisor restarts, and its ref stays valid",
          "[cluster][actors]") {
  LocalCluster local(2);
  auto& cluster = local.cluster;
  troupe::SupervisorSpec spec;
  spec.strategy = troupe::Strategy::one_for_one;
  spec.intensity = 5;
  spec.period = 10s;
  spec.children.push_back(troupe::remote_worker<Counter>(cluster, "counter", {.max_task_retries = 1}, 7, "supervised"));
  auto sup = local.rt.start_supervisor("app", spec).value();
  auto counter = sup.child<Counter>("counter").value();
  CHECK(counter.ask(Add{1}).get().value() == 8);
  int64_t pid = counter.ask(Pid{}).get().value();
  CHECK(pid != getpid());
  auto restarts = [&] {
    auto children = sup.which_children().value();
    return children.empty() ? 0u : children[0].restarts;
  };

  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  // The ask (in flight at the kill, so retried) reaches the restarted child,
  // which starts from the state its previous actor last saved (8).
  CHECK(counter.ask(Tag{}).get().value() == "supervised");
  CHECK(counter.ask(Total{}).get().value() == 8);
  CHECK(counter.ask(Pid{}).get().value() != pid);
  CHECK(restarts() == 1);

  // The loss of its node is a crash too: it comes back on the other node.
  std::string node;
  auto before = cluster.list_actors().value();
  for (auto& a : before) {
    if (a.state == "alive") node = a.node;
  }
  REQUIRE(!node.empty());
  local.agents[node == "a1" ? 0 : 1]->kill9();
  CHECK(counter.ask(Add{2}).get().value() == 10);
  CHECK(restarts() == 2);
  int alive = 0;
  auto now = cluster.list_actors().value();
  for (auto& a : now) {
    if (a.state == "alive") {
      ++alive;
      CHECK(a.node != node);
    }
  }
  CHECK(alive == 1);

  // Stopping the supervisor stops its actor on the cluster.
  auto down = local.rt.monitor(sup.ref(), 10s);
  local.rt.stop(sup.ref());
  REQUIRE(down.get().has_value());
  bool stopped = false;
  for (int i = 0; i < 500 && !stopped; ++i) {
    stopped = true;
    auto listed = cluster.list_actors().value();
    for (auto& a : listed) stopped &= a.state == "dead";
    if (!stopped) std::this_thread::sleep_for(10ms);  // polling the head
  }
  CHECK(stopped);
}

TEST_CASE(
    "cluster actors: when a supervisor gives up on its child on the cluster, asks waiting for the child's "
    "next incarnation fail at once with actor_dead, not at their timeout",
    "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  const std::string marker =
      (std::filesystem::temp_directory_path() / ("troupe-fragile-child-" + std::to_string(getpid()))).string();
  std::filesystem::remove(marker);
  troupe::SupervisorSpec spec;
  spec.strategy = troupe::Strategy::one_for_one;
  spec.intensity = 1;  // the crash is restarted once; that restart's failure gives up
  spec.period = 60s;
  spec.children.push_back(troupe::remote_worker<Fragile>(cluster, "fragile", {.max_task_retries = 1}, marker));
  auto sup = local.rt.start_supervisor("app", spec).value();
  auto fragile = sup.child<Fragile>("fragile").value();
  REQUIRE(fragile.ask(Total{}).get().value() == 1);
  auto down = local.rt.monitor(sup.ref(), 30s);

  // The actor crashes and cannot start again: asks sent now wait in the
  // child's relay (or come back to it from the dead actor's mailbox, to be
  // retried) while the supervisor restarts the child and the restart fails.
  std::ofstream(marker) << "gone";
  REQUIRE(fragile.tell(Crash{}).ok());
  const auto ask_timeout = 20s;
  std::vector<troupe::Future<int>> asks;
  for (int i = 0; i < 16; ++i) {
    (void)fragile.tell(Total{});  // tells are dropped with the child, and must not hold anything up
    asks.push_back(fragile.ask(Total{}, ask_timeout));
  }
  for (auto& a : asks) {
    auto r = a.get();
    REQUIRE_FALSE(r.has_value());
    // Without closing the relay these waited for an incarnation no one
    // would start, and ended with `timeout` after 20 s.
    CHECK(r.error().code() == ErrorCode::actor_dead);
    CHECK_THAT(r.error().message(), Catch::Contains("stopped"));
  }
  auto why = down.get();
  std::filesystem::remove(marker);
  REQUIRE(why.has_value());
  CHECK_THAT(why->to_string(), Catch::Contains("max restart intensity"));
  auto after = fragile.ask(Total{}).get();
  REQUIRE_FALSE(after.has_value());
  CHECK(after.error().code() == ErrorCode::actor_dead);
}

TEST_CASE("cluster actors: troupe::init with no address starts an embedded cluster whose workers run this "
          "program, and stops it with the session",
          "[cluster][actors]") {
  troupe::InitOptions options;
  options.runtime.log_level = "error";
  options.runtime.cluster_token = kToken;
  auto session = troupe::init(options);
  REQUIRE(session.has_value());
  CHECK((*session)->embedded());
  auto counter = (*session)->cluster().spawn<Counter>({.max_restarts = -1}, 3, "init").value();
  CHECK(counter.ask(Add{2}).get().value() == 5);
  auto pid = static_cast<pid_t>(counter.ask(Pid{}).get().value());
  CHECK(pid != getpid());
  auto st = (*session)->cluster().status().value();
  REQUIRE(st.nodes.size() == 1);
  CHECK(st.nodes[0].state == "alive");
  session->reset();  // the agent stops (and reaps) its workers
  CHECK(::kill(pid, 0) == -1);
  CHECK(errno == ESRCH);
}

TEST_CASE("cluster actors: an actor in a bundle whose node dies comes back where the group is rescheduled",
          "[cluster][actors]") {
  LocalCluster local(3);
  auto& cluster = local.cluster;
  troupe::PlacementGroupSpec spec;
  spec.strategy = troupe::PlacementStrategy::strict_spread;
  spec.bundles.assign(2, troupe::Bundle{{{"CPU", 1}}});
  auto pg = cluster.create_placement_group(spec).value();
  auto group = cluster.wait_placement_group(pg, 10s).value();
  auto info = cluster.spawn_info<Counter>({.resources = {{"CPU", 1}}, .placement_group = pg, .bundle = 1,
                                           .max_restarts = -1},
                                          0, "in-bundle")
                  .value();
  REQUIRE(info.node == group.bundle_nodes[1]);
  auto counter = cluster.follow<Counter>(info).value();
  REQUIRE(counter.ask(Add{21}).get().value() == 21);
  std::string lost = info.node;
  local.agents[std::stoi(lost.substr(1)) - 1]->kill9();
  // The group is rescheduled first; the actor follows its bundle there.
  auto back = alive_again(cluster, info.id, 1);
  auto moved = cluster.wait_placement_group(pg, 10s).value();
  CHECK(moved.bundle_nodes[1] != lost);
  CHECK(back.node == moved.bundle_nodes[1]);
  CHECK(counter.ask(Total{}).get().value() == 21);
}

TEST_CASE("cluster actors: while the head is down, a spawn waits for it (bounded) and then succeeds",
          "[cluster][actors]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  std::string address = local.head_process->address();
  local.head_process->kill9();
  troupe::Result<troupe::ActorInfo> spawned = troupe::error(ErrorCode::timeout, "not yet");
  std::thread driver([&] { spawned = cluster.spawn_info<Counter>({}, 1, "late"); });
  // The spawn is retrying against the dead address meanwhile.
  local.head_process = head(local.home, address.substr(address.rfind(':') + 1));
  driver.join();
  REQUIRE(spawned.has_value());
  CHECK(spawned->state == "alive");
  CHECK(cluster.list_actors().value().size() == 1);  // one actor, however many attempts
}
