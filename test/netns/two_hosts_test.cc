// Two hosts on one machine: network namespaces joined by a veth pair, the
// head in one, an agent in the other, talking over a real (virtual) link with
// their own addresses (and hostnames). What crosses: registration,
// heartbeats, a job that runs on the other host, the loss of that host's
// agent, and an RL job whose trainer and rollout engine are on different
// hosts (the weights cross by one-sided reads).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <tuple>
#include <vector>
#include <string>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "support/daemon.h"

using namespace std::chrono_literals;
using troupe::test::Daemon;
namespace fs = std::filesystem;

namespace {

constexpr const char* kToken = "two-hosts-token";

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

/// Two namespaces, "hosts" A (x.1) and B (x.2), on a /24 of their own.
struct TwoHosts {
  std::string a = "trp-a-" + std::to_string(getpid()), b = "trp-b-" + std::to_string(getpid());
  std::string net = "10.77." + std::to_string(getpid() % 250) + ".";
  std::string ip_a = net + "1", ip_b = net + "2";
  fs::path home = fs::temp_directory_path() / ("troupe-2h-" + std::to_string(getpid()));
  TwoHosts() {
    std::string va = "va" + std::to_string(getpid()), vb = "vb" + std::to_string(getpid());
    REQUIRE(sh("ip netns add " + a) == 0);
    REQUIRE(sh("ip netns add " + b) == 0);
    REQUIRE(sh("ip link add " + va + " type veth peer name " + vb) == 0);
    REQUIRE(sh("ip link set " + va + " netns " + a) == 0);
    REQUIRE(sh("ip link set " + vb + " netns " + b) == 0);
    REQUIRE(sh("ip -n " + a + " addr add " + ip_a + "/24 dev " + va) == 0);
    REQUIRE(sh("ip -n " + b + " addr add " + ip_b + "/24 dev " + vb) == 0);
    for (auto& [ns, dev] : {std::pair{a, va}, std::pair{b, vb}}) {
      REQUIRE(sh("ip -n " + ns + " link set " + dev + " up") == 0);
      REQUIRE(sh("ip -n " + ns + " link set lo up") == 0);
    }
  }
  ~TwoHosts() {
    sh("ip netns del " + a);  // takes the veth pair with it
    sh("ip netns del " + b);
    std::error_code ec;
    fs::remove_all(home, ec);
  }
  /// Each host's name (its own UTS namespace), and an IPC namespace of its
  /// own for every process started "on a host": UCX takes two processes for
  /// one node when they share the boot id and the IPC namespace (not the
  /// hostname), and would then use shared memory between the hosts, whose
  /// wake-ups (abstract unix sockets) do not cross network namespaces.
  std::string name_of(const std::string& ns) const { return ns == a ? "host-a" : "host-b"; }
  /// The prefix that runs a command on host `ns`.
  std::vector<std::string> in(const std::string& ns) const {
    return {"ip",      "netns", "exec", ns, "unshare", "-u", "-i", "sh", "-c",
            "hostname " + name_of(ns) + " && exec \"$@\"", "sh"};
  }
  /// The command line, run in namespace `ns`: exit code and output.
  std::pair<int, std::string> cli(const std::string& ns, const std::string& address, const std::string& args) const {
    return troupe::test::run_command("ip netns exec " + ns + " unshare -u -i sh -c 'hostname " + name_of(ns) +
                                     " && exec \"$@\"' sh env TROUPE_HOME=" + (home / ns).string() +
                                     " TROUPE_CLUSTER_TOKEN=" + kToken + " TROUPE_ADDRESS=" + address + " " +
                                     TROUPE_CLI + " " + args);
  }
};

}  // namespace

TEST_CASE("two hosts: an agent on another host joins, runs a job there, and its loss is seen", "[netns]") {
  TwoHosts hosts;
  Daemon head(TROUPE_CLI, hosts.home / hosts.a, kToken,
              {"start", "--head", "--host", hosts.ip_a, "--port", "0", "--data-dir", (hosts.home / "head").string()},
              hosts.in(hosts.a));
  INFO("head said: " << head.said());
  REQUIRE(head.ok());
  CHECK(head.address().find(hosts.ip_a) != std::string::npos);
  Daemon agent(TROUPE_CLI, hosts.home / hosts.b, kToken,
               {"start", "--address", head.address(), "--host", hosts.ip_b, "--node-id", "far", "--cpus", "2"},
               hosts.in(hosts.b));
  INFO("agent said: " << agent.said());
  REQUIRE(agent.ok());
  CHECK(agent.address().find(hosts.ip_b) != std::string::npos);

  auto [code, out] = hosts.cli(hosts.a, head.address(), "list nodes --json");
  REQUIRE(code == 0);
  CHECK(out.find("\"far\"") != std::string::npos);
  CHECK(out.find(hosts.ip_b) != std::string::npos);

  // A job submitted from host A runs on host B: it sees B's address.
  std::tie(code, out) = hosts.cli(hosts.a, head.address(), "job submit --node far -- ip -4 -o addr show");
  REQUIRE(code == 0);
  std::string id = out.substr(0, out.find('\n'));
  std::string logs;
  for (int i = 0; i < 200 && logs.find(hosts.ip_b) == std::string::npos; ++i) {
    std::this_thread::sleep_for(20ms);  // polling the other host's job output
    logs = hosts.cli(hosts.a, head.address(), "job logs " + id).second;
  }
  CHECK(logs.find(hosts.ip_b) != std::string::npos);
  CHECK(logs.find(hosts.ip_a) == std::string::npos);

  // The other host's agent dies: the head sees its node dead.
  agent.kill9();
  bool dead = false;
  for (int i = 0; i < 100 && !dead; ++i) {
    auto st = hosts.cli(hosts.a, head.address(), "list nodes");
    dead = st.second.find("far") != std::string::npos && st.second.find("dead") != std::string::npos;
    if (!dead) std::this_thread::sleep_for(20ms);  // polling the head
  }
  CHECK(dead);
}

TEST_CASE("two hosts: an RL job trains on one host and generates on the other, the weights crossing between them",
          "[netns][rl]") {
  // ucx: one-sided reads over UCX's TCP transport between the hosts.
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "ucx");
  INFO("transport " << transport);
  TwoHosts hosts;
  Daemon head(TROUPE_CLI, hosts.home / hosts.a, kToken,
              {"start", "--head", "--host", hosts.ip_a, "--port", "0", "--data-dir", (hosts.home / "head").string(),
               "--transport", transport},
              hosts.in(hosts.a));
  INFO("head said: " << head.said());
  REQUIRE(head.ok());
  // Two CPUs a host; the trainer rank takes two (its threads), so the
  // rollout engine and the reward worker go to the other host.
  std::vector<std::unique_ptr<Daemon>> agents;
  for (const auto& [ns, ip, node] : {std::tuple{hosts.a, hosts.ip_a, "near"}, std::tuple{hosts.b, hosts.ip_b, "far"}}) {
    agents.push_back(std::make_unique<Daemon>(TROUPE_CLI, hosts.home / ns, kToken,
                                              std::vector<std::string>{"start", "--address", head.address(), "--host",
                                                                       ip, "--node-id", node, "--cpus", "2",
                                                                       "--transport", transport},
                                              hosts.in(ns)));
    INFO("agent said: " << agents.back()->said());
    REQUIRE(agents.back()->ok());
  }
  const fs::path job = hosts.home / "job.toml";
  {
    std::ofstream out(job);
    out << "[run]\nseed = 3\nsteps = 6\neval_every = 3\nplacement = \"disaggregated\"\n"
           "[warmup]\nsteps = 300\nexamples = 2000\nmin_digits = 1\nmax_digits = 1\n"
           "[task]\neval_problems = 50\nmin_digits = 1\nmax_digits = 1\n"
           "[algorithm]\nprompts_per_step = 8\ngroup_size = 4\n"
           "[trainer]\nthreads = 2\n";
  }
  const fs::path run = hosts.home / "run";
  auto [code, out] = hosts.cli(hosts.a, head.address(),
                               "rl train " + job.string() + " --run-dir " + run.string() + " --transport " + transport);
  INFO(out);
  REQUIRE(code == 0);
  CHECK(out.find("done: 6 steps") != std::string::npos);
  CHECK(out.find(" 0 fault(s)") != std::string::npos);
  // Where the meshes ran (the ended actors stay listed with their node).
  std::string listed;
  std::tie(code, listed) = hosts.cli(hosts.a, head.address(), "list actors --json");
  REQUIRE(code == 0);
  std::string trainer_node, engine_node;
  for (const auto& a : nlohmann::json::parse(listed)) {
    const std::string cls = a.value("class_name", "");
    if (cls.find("TrainerRank") != std::string::npos) trainer_node = a.value("node", "");
    if (cls.find("RolloutEngine") != std::string::npos) engine_node = a.value("node", "");
  }
  INFO(listed);
  CHECK_FALSE(trainer_node.empty());
  CHECK_FALSE(engine_node.empty());
  CHECK(trainer_node != engine_node);
  // Every step's weights reached the other host's engine.
  std::ifstream metrics(run / "metrics.jsonl");
  size_t steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] != "step") continue;
    ++steps;
    CHECK(j["sync_gbps"].get<double>() > 0);
  }
  CHECK(steps == 6);
}
