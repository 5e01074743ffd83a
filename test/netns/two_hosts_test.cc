// Two hosts on one machine: network namespaces joined by a veth pair, the
// head in one, an agent in the other, talking over a real (virtual) link with
// their own addresses. What crosses: registration, heartbeats, a job that
// runs on the other host, the loss of that host's agent.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

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
  std::vector<std::string> in(const std::string& ns) const { return {"ip", "netns", "exec", ns}; }
  /// The command line, run in namespace `ns`: exit code and output.
  std::pair<int, std::string> cli(const std::string& ns, const std::string& address, const std::string& args) const {
    return troupe::test::run_command("ip netns exec " + ns + " env TROUPE_HOME=" + (home / ns).string() +
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
