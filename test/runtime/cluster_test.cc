// The cluster with real processes: a head and node agents started with the
// `troupe` command line (in the foreground, as children of the test), a
// driver that reserves placement groups, and the failures: an agent killed
// or hung, the head killed and started again on its data directory, a node
// whose CPUs are saturated.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "support/local_cluster.h"
#include "troupe/cluster.h"
#include "troupe/troupe.h"

using namespace std::chrono_literals;
using troupe::ErrorCode;
using troupe::test::Daemon;
using namespace troupe::test;
namespace fs = std::filesystem;

namespace {

troupe::PlacementGroupSpec spread(int bundles, double cpus = 1) {
  troupe::PlacementGroupSpec spec;
  spec.strategy = troupe::PlacementStrategy::strict_spread;
  spec.bundles.assign(bundles, troupe::Bundle{{{"CPU", cpus}}});
  return spec;
}

const troupe::NodeInfo* find_node(const troupe::ClusterStatus& st, const std::string& id) {
  for (auto& n : st.nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

/// A named actor for the directory tests.
struct WhoAreYou {
  TROUPE_MESSAGE(WhoAreYou);
};
class Named : public troupe::Actor<Named, WhoAreYou> {
 public:
  explicit Named(int n) : n_(n) {}
  int handle(const WhoAreYou&) { return n_; }

 private:
  int n_;
};

}  // namespace

TEST_CASE("cluster: STRICT_SPREAD over three agents puts one bundle on each", "[cluster]") {
  LocalCluster local(3);
  auto& cluster = local.cluster;
  auto id = cluster.create_placement_group(spread(3)).value();
  auto pg = cluster.wait_placement_group(id, 10s);
  REQUIRE(pg.has_value());
  CHECK(pg->state == "created");
  CHECK(std::set<std::string>(pg->bundle_nodes.begin(), pg->bundle_nodes.end()) ==
        std::set<std::string>{"a1", "a2", "a3"});
  auto st = cluster.status().value();
  for (auto& n : st.nodes) CHECK(n.free.at("CPU") == 1);
  REQUIRE(cluster.remove_placement_group(id).ok());
  st = cluster.status().value();
  for (auto& n : st.nodes) CHECK(n.free.at("CPU") == 2);
  CHECK(cluster.remove_placement_group(id).code() == ErrorCode::not_found);
}

TEST_CASE("cluster: an infeasible group waits with its reason, and is placed when a node joins", "[cluster]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto id = cluster.create_placement_group(spread(2)).value();
  auto waited = cluster.wait_placement_group(id, 300ms);
  REQUIRE_FALSE(waited.has_value());
  CHECK(waited.error().code() == ErrorCode::timeout);
  CHECK_THAT(waited.error().message(), Catch::Contains("STRICT_SPREAD needs 2 distinct nodes"));
  auto st = cluster.status().value();
  REQUIRE(st.placement_groups.size() == 1);
  CHECK(st.placement_groups[0].state == "pending");
  CHECK_FALSE(st.placement_groups[0].reason.empty());

  local.add_agent("a2");
  auto pg = cluster.wait_placement_group(id, 10s);
  REQUIRE(pg.has_value());
  CHECK(pg->state == "created");
}

TEST_CASE("cluster: kill -9 of an agent marks its node dead at once and moves its bundles", "[cluster]") {
  LocalCluster local(2);
  auto& cluster = local.cluster;
  auto id = cluster.create_placement_group(spread(2)).value();
  REQUIRE(cluster.wait_placement_group(id, 10s).has_value());
  local.add_agent("a3");  // room for the bundle that will move

  auto killed = Clock::now();
  local.agents[0]->kill9();
  REQUIRE(status_until(cluster, 2s, [](auto& st) { return find_node(st, "a1")->state == "dead"; }));
  auto detected_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed).count();
  CHECK(detected_ms < 2000);
  auto pg = cluster.wait_placement_group(id, 10s);
  REQUIRE(pg.has_value());
  CHECK(std::set<std::string>(pg->bundle_nodes.begin(), pg->bundle_nodes.end()) ==
        std::set<std::string>{"a2", "a3"});
}

TEST_CASE("cluster: a hung agent is declared dead by the heartbeat bound, and rejoins when it wakes", "[cluster]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  auto stopped = Clock::now();
  local.agents[0]->signal(SIGSTOP);  // its connection stays open: only the heartbeats stop
  REQUIRE(status_until(cluster, 4s, [](auto& st) { return find_node(st, "a1")->state == "dead"; }));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped).count();
  CHECK(ms >= 1900);  // not before the bound (2 s)
  CHECK(ms < 3000);   // and soon after it
  local.agents[0]->signal(SIGCONT);
  CHECK(status_until(cluster, 5s, [](auto& st) { return find_node(st, "a1")->state == "alive"; }));
}

TEST_CASE("cluster: kill -9 of the head, started again on its data directory it has lost nothing", "[cluster]") {
  TempHome home;
  auto h = head(home);
  std::string address = h->address();
  std::string port = address.substr(address.rfind(':') + 1);
  auto a1 = agent(home, address, "a1");
  auto a2 = agent(home, address, "a2");
  std::string id;
  std::vector<std::string> where;
  {
    troupe::Runtime rt(driver());
    auto cluster = troupe::ClusterClient::connect(rt, address).value();
    id = cluster.create_placement_group(spread(2)).value();
    where = cluster.wait_placement_group(id, 10s).value().bundle_nodes;
    auto pending = spread(3);
    pending.name = "waits";
    REQUIRE(cluster.create_placement_group(pending).has_value());  // stays pending: two nodes only
  }
  h->kill9();
  h = head(home, port);
  troupe::Runtime rt(driver());
  auto cluster = troupe::ClusterClient::connect(rt, address).value();
  auto pg = cluster.wait_placement_group(id, 10s);
  REQUIRE(pg.has_value());
  CHECK(pg->bundle_nodes == where);
  // The agents found the new head by themselves.
  REQUIRE(status_until(cluster, 5s, [](auto& st) {
    return st.nodes.size() == 2 && find_node(st, "a1")->connected && find_node(st, "a2")->connected;
  }));
  auto st = cluster.status().value();
  REQUIRE(st.placement_groups.size() == 2);
  for (auto& g : st.placement_groups) {
    if (g.spec.name == "waits") CHECK(g.state == "pending");
  }
  // Its resources are still accounted for: each node keeps 1 of 2 CPUs.
  for (auto& n : st.nodes) CHECK(n.free.at("CPU") == 1);
  auto again = spread(3);
  again.name = "waits";
  CHECK(cluster.create_placement_group(again).error().code() == ErrorCode::already_exists);
}

TEST_CASE("cluster: a node whose CPUs are saturated is not declared dead", "[cluster]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  unsigned cores = std::max(2u, std::thread::hardware_concurrency());
  std::vector<pid_t> burners;
  for (unsigned i = 0; i < 2 * cores; ++i) {
    pid_t p = fork();
    if (p == 0) {
      volatile uint64_t x = 0;
      for (;;) x = x + 1;
    }
    burners.push_back(p);
  }
  auto until = Clock::now() + 5s;
  bool ever_dead = false;
  while (Clock::now() < until) {
    if (auto st = cluster.status(); st && find_node(*st, "a1")->state != "alive") ever_dead = true;
    std::this_thread::sleep_for(100ms);  // sampling the head's view during the load
  }
  for (pid_t p : burners) {
    kill(p, SIGKILL);
    waitpid(p, nullptr, 0);
  }
  CHECK_FALSE(ever_dead);
}

TEST_CASE("troupe command line: bad usage and a missing head get one clear line and exit codes", "[cluster]") {
  TempHome home;
  auto run = [&](const std::string& args) {
    return troupe::test::run_command("TROUPE_HOME=" + home.path.string() + " TROUPE_CLUSTER_TOKEN=" + kToken + " " +
                                     TROUPE_CLI + " " + args);
  };
  auto [code, out] = run("start --head --address 1.2.3.4:5");
  CHECK(code == 2);
  CHECK_THAT(out, Catch::Contains("give --head to start a head, or --address HOST:PORT"));
  std::tie(code, out) = run("start --address 127.0.0.1:1 --labels rack");
  CHECK(code == 2);
  CHECK_THAT(out, Catch::Contains("is not key=value"));
  std::tie(code, out) = run("status --address 127.0.0.1:1");
  CHECK(code == 1);
  CHECK_THAT(out, Catch::Contains("no head answers at tcp://127.0.0.1:1"));
  CHECK_THAT(out, Catch::Contains("was tried over TCP") && Catch::Contains("ucx://127.0.0.1:1"));
  std::tie(code, out) = run("status");
  CHECK(code == 1);
  CHECK_THAT(out, Catch::Contains("start one with `troupe start --head`"));
  std::tie(code, out) = run("frobnicate");
  CHECK(code == 2);
  std::tie(code, out) = run("--help");
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("start"));
}

TEST_CASE("troupe command line: a bare HOST:PORT of a UCX head started on this machine reaches it", "[cluster]") {
  TempHome home;
  auto run = [&](const std::string& args) {
    return troupe::test::run_command("TROUPE_HOME=" + home.path.string() + " TROUPE_CLUSTER_TOKEN=" + kToken + " " +
                                     TROUPE_CLI + " " + args);
  };
  auto [code, out] = run("start --head --transport ucx --port 0 --data-dir " + (home.path / "head").string());
  INFO(out);
  REQUIRE(code == 0);
  const auto at = out.find("ucx://");
  REQUIRE(at != std::string::npos);
  const std::string bare = out.substr(at + 6, out.find_first_of(" \n", at) - at - 6);
  std::tie(code, out) = run("status --address " + bare);
  INFO(out);
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("head ucx://" + bare));
  std::tie(code, out) = run("stop");
  CHECK(code == 0);
}

TEST_CASE("cluster: a job submitted with the command line runs, its output is readable, and it stops", "[cluster]") {
  LocalCluster local(2);
  auto cli = [&](const std::string& args) {
    return troupe::test::run_command("TROUPE_HOME=" + local.home.path.string() + " TROUPE_CLUSTER_TOKEN=" + kToken +
                                     " TROUPE_ADDRESS=" + local.head_process->address() + " " + TROUPE_CLI + " " + args);
  };
  auto finished = [&](const std::string& id) {
    auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline) {
      auto j = local.cluster.job(id);
      if (j && j->state != "running") return *j;
      std::this_thread::sleep_for(20ms);  // polling another process's state
    }
    return troupe::JobInfo{};
  };

  auto [code, out] = cli("job submit --node a2 --env WHO=troupe -- sh -c 'echo hello $WHO; echo warn >&2; exit 3'");
  REQUIRE(code == 0);
  std::string id = out.substr(0, out.find('\n'));
  REQUIRE(id.rfind("job-", 0) == 0);
  auto job = finished(id);
  CHECK(job.state == "failed");
  CHECK(job.exit_code == 3);
  CHECK(job.node == "a2");
  std::tie(code, out) = cli("job logs " + id);
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("hello troupe"));
  CHECK_THAT(out, Catch::Contains("warn"));
  std::tie(code, out) = cli("job status " + id);
  CHECK_THAT(out, Catch::Contains("failed on a2 exit_code=3"));

  auto ok = local.cluster.submit_job({"true"});
  REQUIRE(ok.has_value());
  CHECK(finished(*ok).state == "succeeded");

  auto sleeper = local.cluster.submit_job({"sleep", "100"});
  REQUIRE(sleeper.has_value());
  std::tie(code, out) = cli("job stop " + *sleeper);
  CHECK(code == 0);
  auto stopped = finished(*sleeper);
  CHECK(stopped.state == "stopped");
  CHECK(stopped.exit_code == -SIGTERM);

  auto missing = local.cluster.submit_job({"/no/such/program"});
  REQUIRE_FALSE(missing.has_value());
  CHECK_THAT(missing.error().message(), Catch::Contains("cannot run '/no/such/program'"));
  std::tie(code, out) = cli("job status job-0000");
  CHECK(code == 1);
  CHECK_THAT(out, Catch::Contains("does not exist"));
}

TEST_CASE("cluster: while the head is down, creating a group waits for it, bounded", "[cluster]") {
  LocalCluster local(2);
  auto& cluster = local.cluster;
  std::string address = local.head_process->address();
  std::string port = address.substr(address.rfind(':') + 1);
  local.head_process->kill9();

  // Bounded: with no head coming back, the call fails after its timeout.
  auto t0 = Clock::now();
  auto gone = cluster.create_placement_group(spread(1), 400ms);
  REQUIRE_FALSE(gone.has_value());
  CHECK((gone.error().code() == ErrorCode::peer_lost || gone.error().code() == ErrorCode::actor_dead ||
         gone.error().code() == ErrorCode::refused || gone.error().code() == ErrorCode::timeout));
  CHECK(Clock::now() - t0 >= 400ms);

  // Waiting: a head that comes back within the timeout takes the request.
  troupe::Result<std::string> made = troupe::error(ErrorCode::timeout, "not yet");
  std::thread creator([&] { made = cluster.create_placement_group(spread(2), 20s); });
  std::this_thread::sleep_for(300ms);  // keeps the head down while the call retries (not a synchronisation)
  local.head_process = head(local.home, port);
  creator.join();
  REQUIRE(made.has_value());
  auto pg = cluster.wait_placement_group(*made, 10s);
  REQUIRE(pg.has_value());
  CHECK(pg->state == "created");
  auto st = cluster.status().value();
  CHECK(st.placement_groups.size() == 1);  // created once, whatever the retries
}

TEST_CASE("cluster: a job that ends while the head is down is known to the restarted head", "[cluster]") {
  LocalCluster local(1);
  std::string address = local.head_process->address();
  std::string port = address.substr(address.rfind(':') + 1);
  // A marker in its command line, to see from here when its process is gone.
  std::string marker = "troupe-test-job-" + std::to_string(getpid());
  auto id = local.cluster.submit_job({"sh", "-c", "sleep 0.3; exit 7", marker});
  REQUIRE(id.has_value());
  local.head_process->kill9();
  // The job ends with no head to tell: wait until its process has gone.
  bool ended = false;
  for (int i = 0; i < 500 && !ended; ++i) {
    // "[t]" keeps pgrep from finding the shell that runs it.
    ended = troupe::test::run_command("pgrep -f '[t]" + marker.substr(1) + "'").first != 0;
    if (!ended) std::this_thread::sleep_for(20ms);  // polling another process
  }
  REQUIRE(ended);
  local.head_process = head(local.home, port);
  bool told = false;
  for (int i = 0; i < 250 && !told; ++i) {
    auto j = local.cluster.job(*id);
    told = j && j->state == "failed" && j->exit_code == 7;
    if (!told) std::this_thread::sleep_for(20ms);  // polling the restarted head
  }
  CHECK(told);
}

TEST_CASE("cluster: named actors: the first to register wins, all get it, and the name frees when it stops",
          "[cluster]") {
  LocalCluster local(1);
  auto& cluster = local.cluster;
  constexpr int kRacers = 8;
  std::vector<troupe::ActorRef<Named>> actors;
  for (int i = 0; i < kRacers; ++i) actors.push_back(local.rt.spawn<Named>(i));
  std::vector<troupe::Result<troupe::AnyRef>> got(kRacers, troupe::error(ErrorCode::timeout, "not yet"));
  std::vector<std::thread> racers;
  for (int i = 0; i < kRacers; ++i) {
    racers.emplace_back([&, i] { got[i] = cluster.register_name(actors[i], "counter", "team"); });
  }
  for (auto& t : racers) t.join();
  std::set<int> answers;
  for (auto& g : got) {
    REQUIRE(g.has_value());
    answers.insert(g->ask<int>(WhoAreYou{}).get().value());
  }
  REQUIRE(answers.size() == 1);  // one winner, the same for everyone
  int winner = *answers.begin();

  auto found = cluster.get_actor_as<Named>("counter", "team");
  REQUIRE(found.has_value());
  CHECK(found->ask(WhoAreYou{}).get().value() == winner);
  CHECK(cluster.get_actor("counter", "other").error().code() == ErrorCode::not_found);
  auto st = cluster.status().value();
  REQUIRE(st.named_actors.size() == 1);
  CHECK(st.named_actors[0].ns == "team");

  // It survives a head restart...
  std::string address = local.head_process->address();
  local.head_process->kill9();
  local.head_process = head(local.home, address.substr(address.rfind(':') + 1));
  auto again = cluster.get_actor_as<Named>("counter", "team");
  REQUIRE(again.has_value());
  CHECK(again->ask(WhoAreYou{}).get().value() == winner);

  // ...and leaves the directory when its actor stops: the name is free.
  local.rt.stop(actors[winner]);
  bool freed = false;
  for (int i = 0; i < 250 && !freed; ++i) {
    freed = !cluster.get_actor("counter", "team").has_value();
    if (!freed) std::this_thread::sleep_for(20ms);  // polling the head
  }
  CHECK(freed);
  int next = (winner + 1) % kRacers;
  auto taken = cluster.register_name(actors[next], "counter", "team");
  REQUIRE(taken.has_value());
  CHECK(taken->ask<int>(WhoAreYou{}).get().value() == next);
}
