// A local cluster for tests: a head and node agents started with the `troupe`
// command line (in the foreground, as children of the test, dying with it),
// and a driver runtime connected to the head.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "support/daemon.h"
#include "troupe/cluster.h"
#include "troupe/mesh.h"
#include "troupe/troupe.h"

namespace troupe::test {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

using Clock = std::chrono::steady_clock;

inline constexpr const char* kToken = "cluster-test-token";

struct TempHome {
  fs::path path = fs::temp_directory_path() /
                  ("troupe-cluster-" + std::to_string(getpid()) + "-" +
                   std::to_string(Clock::now().time_since_epoch().count()));
  ~TempHome() {
    // TROUPE_TEST_KEEP_HOME=1 keeps the daemons' and workers' logs to read.
    if (const char* keep = std::getenv("TROUPE_TEST_KEEP_HOME"); keep != nullptr && std::string(keep) == "1") return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

inline std::unique_ptr<Daemon> launch(const TempHome& home, std::vector<std::string> args,
                                      std::vector<std::string> prefix = {}) {
  auto d = std::make_unique<Daemon>(troupe_cli(), home.path, kToken, std::move(args), std::move(prefix));
  INFO("the daemon said: " << d->said());
  REQUIRE(d->ok());
  return d;
}

inline std::unique_ptr<Daemon> head(const TempHome& home, const std::string& port = "0") {
  return launch(home, {"start", "--head", "--port", port, "--data-dir", (home.path / "head").string()});
}
/// `host_id`, when given, is the agent's (and its workers') TROUPE_HOST_ID:
/// agents with different ones stand for different hosts as far as shared
/// memory goes (collectives/host_id.h).
inline std::unique_ptr<Daemon> agent(const TempHome& home, const std::string& head_address, const std::string& id,
                                     const std::string& cpus = "2", const std::string& labels = "",
                                     const std::string& host_id = "") {
  std::vector<std::string> args{"start", "--address", head_address, "--node-id", id, "--cpus", cpus};
  if (!labels.empty()) {
    args.push_back("--labels");
    args.push_back(labels);
  }
  std::vector<std::string> prefix;
  if (!host_id.empty()) prefix = {"env", "TROUPE_HOST_ID=" + host_id};
  return launch(home, args, prefix);
}

/// Polls the head's status until `pred` holds or `timeout` passes.
template <class Pred>
bool status_until(const troupe::ClusterClient& c, std::chrono::milliseconds timeout, Pred pred) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (auto st = c.status(); st && pred(*st)) return true;
    std::this_thread::sleep_for(20ms);  // polling another process's view, not synchronising threads
  }
  return false;
}

inline troupe::RuntimeConfig driver() {
  troupe::RuntimeConfig cfg;
  cfg.listen = "tcp://127.0.0.1:0";  // named actors must be reachable
  cfg.log_level = "error";
  cfg.cluster_token = kToken;
  return cfg;
}

/// A head, agents "a1".."a<n>" (2 CPUs each), and a driver connected to the
/// head once all of them have registered.
struct LocalCluster {
  TempHome home;
  std::unique_ptr<Daemon> head_process = head(home);
  std::vector<std::unique_ptr<Daemon>> agents;
  troupe::Runtime rt{driver()};
  troupe::ClusterClient cluster = troupe::ClusterClient::connect(rt, head_process->address()).value();

  explicit LocalCluster(int n) {
    for (int i = 1; i <= n; ++i) add_agent("a" + std::to_string(i));
  }
  /// One agent per host id ("a1" with host_ids[0], ...).
  explicit LocalCluster(const std::vector<std::string>& host_ids) {
    for (size_t i = 0; i < host_ids.size(); ++i) add_agent("a" + std::to_string(i + 1), "2", "", host_ids[i]);
  }
  Daemon& add_agent(const std::string& id, const std::string& cpus = "2", const std::string& labels = "",
                    const std::string& host_id = "") {
    agents.push_back(agent(home, head_process->address(), id, cpus, labels, host_id));
    size_t want = agents.size();
    REQUIRE(status_until(cluster, 5s, [&](auto& st) { return st.nodes.size() == want; }));
    return *agents.back();
  }
};

/// A {hosts: 2, procs: 4} proc mesh of 8 worker processes over two 2-CPU
/// agents (a PACK group of 8 half-CPU bundles: 4 per agent, ranks 0-3 on
/// one); or over one agent per given host id, placed by `strategy`.
struct EightProcessMesh {
  EightProcessMesh() : local(2) {}
  EightProcessMesh(const std::vector<std::string>& host_ids, troupe::PlacementStrategy strategy)
      : local(host_ids), strategy(strategy) {}

  LocalCluster local;
  troupe::PlacementStrategy strategy = troupe::PlacementStrategy::pack;
  troupe::Shape shape = troupe::Shape::make({{"hosts", 2}, {"procs", 4}}).value();
  std::string pg = [this] {
    troupe::PlacementGroupSpec spec;
    spec.strategy = strategy;
    spec.bundles.assign(8, troupe::Bundle{{{"CPU", 0.5}}});
    return local.cluster.create_placement_group(spec).value();
  }();
  troupe::ProcMesh procs = troupe::ProcMesh::create(local.cluster, shape, pg).value();
};

}  // namespace troupe::test
