// The cluster with real processes: a head and 4 node agents on this machine
// (the `troupe` command line in the foreground, as children), a driver in
// this process.
//   - placement-group create + ready + remove per second (Ray's published
//     figure: ~790/s), from 8 driver threads;
//   - actors spawned per second across the 4 agents, 10,000 actors (Ray's
//     published figure: ~550/s), from 8 driver threads, in the agents'
//     worker processes (this executable, started by them);
//   - kill -9 of an actor's worker process until the actor (restarted in a
//     new process, from its snapshot) answers an ask again: p50 and p99;
//   - kill -9 of an agent until the head has declared its node dead (Ray:
//     ~15 s by default);
//   - kill -9 of the head until a head started again on its data directory
//     has every node back and every group ready.
// Baselines are Ray's published figures (the numbers), and the raw
// floor of this run: an ask round trip to an agent process.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../common/report.h"
#include "cluster/protocol.h"
#include "../common/local_cluster.h"
#include "troupe/cluster.h"
#include "troupe/worker.h"

using troupe::bench::emit;
using troupe::cluster::GetNodeId;
using troupe::bench::quantile;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kToken = "bench-token";

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct Hit {
  TROUPE_MESSAGE_NAMED(Hit, "bench.cluster.Hit");
};
struct WhichPid {
  TROUPE_MESSAGE_NAMED(WhichPid, "bench.cluster.WhichPid");
};
/// The spawned actor: counts its hits and checkpoints the count before it
/// answers (so that an answered hit survives a kill -9).
class Tally : public troupe::Actor<Tally, Hit, WhichPid> {
 public:
  explicit Tally(int start) : n_(start) {}
  int handle(const Hit&) {
    ++n_;
    checkpoint();
    return n_;
  }
  int64_t handle(const WhichPid&) { return getpid(); }
  std::optional<std::string> snapshot() override { return std::to_string(n_); }
  void restore(std::string_view b) override { n_ = std::stoi(std::string(b)); }

 private:
  int n_;
};

}  // namespace

int main(int argc, char** argv) {
  troupe::serve_if_worker();  // the agents start this executable as their workers
  bool quick = troupe::bench::quick(argc, argv);
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "cluster_bench: %s\n", why.c_str());
    return 1;
  };
  troupe::bench::LocalCluster local("bench", kToken, 4, "64");
  if (!local.error().empty()) return fail(local.error());
  std::string address = local.head().address();
  std::string port = address.substr(address.rfind(':') + 1);
  auto& agents = local.agents();
  troupe::RuntimeConfig cfg;
  cfg.cluster_token = kToken;
  cfg.log_level = "error";
  cfg.listen = "tcp://127.0.0.1:0";  // the owner of the actors it spawns
  troupe::Runtime rt(cfg);
  auto cluster = troupe::ClusterClient::connect(rt, address);
  if (!cluster) return fail(cluster.error().to_string());

  // Floor: an ask round trip to an agent process.
  auto agent0 = rt.resolve_any(agents[0]->address() + "/troupe.agent");
  if (!agent0) return fail(agent0.error().to_string());
  std::vector<double> rtt_us;
  for (int i = 0; i < 2000; ++i) {
    auto t0 = Clock::now();
    (void)agent0->ask<std::string>(GetNodeId{}).get();
    rtt_us.push_back(ms_since(t0) * 1000);
  }
  double floor_us = quantile(rtt_us, 0.5);

  // Placement groups: create, wait until ready, remove; 8 drivers at once,
  // each with 16 groups in flight.
  const int threads = 8, each = quick ? 128 : 1024, window = 16;
  std::atomic<int> errors{0};
  std::vector<std::vector<double>> lat(threads);
  auto t0 = Clock::now();
  std::vector<std::thread> drivers;
  for (int t = 0; t < threads; ++t) {
    drivers.emplace_back([&, t] {
      troupe::PlacementGroupSpec spec;
      spec.strategy = t % 2 ? troupe::PlacementStrategy::spread : troupe::PlacementStrategy::pack;
      spec.bundles.assign(2, troupe::Bundle{{{"CPU", 1}}});
      for (int i = 0; i < each; i += window) {
        auto s0 = Clock::now();
        std::vector<troupe::Future<std::string>> created;
        for (int k = 0; k < window; ++k) created.push_back(cluster->create_placement_group_async(spec));
        std::vector<std::string> ids;
        for (auto& f : created) {
          if (auto id = f.get()) ids.push_back(*id);
        }
        std::vector<troupe::Future<troupe::PlacementGroupInfo>> ready;
        for (auto& id : ids) ready.push_back(cluster->wait_placement_group_async(id, std::chrono::seconds(10)));
        for (auto& f : ready) (void)f.get();
        std::vector<troupe::Future<void>> removed;
        for (auto& id : ids) removed.push_back(cluster->remove_placement_group_async(id));
        int ok = 0;
        for (auto& f : removed) ok += f.get().has_value();
        errors += window - ok;
        lat[t].push_back(ms_since(s0) * 1000 / window);
      }
    });
  }
  for (auto& d : drivers) d.join();
  double secs = ms_since(t0) / 1000;
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  if (errors) std::fprintf(stderr, "cluster_bench: %d placement-group cycles failed\n", errors.load());
  emit("cluster.placement_group_create_remove", "per_s", threads * each / secs, "groups/s",
       "Ray published: ~790 placement groups created+removed per second", 790, "value >= 10000");
  emit("cluster.placement_group_create_remove", "cycle_per_group_p50", quantile(all, 0.5), "us",
       "ask round trip to an agent process, p50 (this run)", floor_us, "report");

  // Actors: 10,000 spawned across the 4 agents, 8 drivers each with 64 in
  // flight; the first ones on each node wait for its worker process.
  {
    const int total = quick ? 2000 : 10000, per = total / threads, in_flight = 64;
    std::atomic<int> failed{0};
    std::vector<std::vector<double>> spawn_lat(threads);
    auto s0 = Clock::now();
    std::vector<std::thread> spawners;
    for (int t = 0; t < threads; ++t) {
      spawners.emplace_back([&, t] {
        for (int i = 0; i < per; i += in_flight) {
          auto w0 = Clock::now();
          std::vector<troupe::Future<troupe::ActorInfo>> batch;
          for (int k = 0; k < in_flight && i + k < per; ++k) batch.push_back(cluster->spawn_async<Tally>({}, k));
          for (auto& f : batch) {
            if (!f.get()) ++failed;
          }
          spawn_lat[t].push_back(ms_since(w0) * 1000 / static_cast<double>(batch.size()));
        }
      });
    }
    for (auto& s : spawners) s.join();
    double spawn_secs = ms_since(s0) / 1000;
    std::vector<double> per_actor;
    for (auto& l : spawn_lat) per_actor.insert(per_actor.end(), l.begin(), l.end());
    if (failed) std::fprintf(stderr, "cluster_bench: %d spawns failed\n", failed.load());
    errors += failed;
    emit("cluster.actor_spawn", "per_s", (per * threads - failed) / spawn_secs, "actors/s",
         "Ray published: ~550 actors launched per second", 550, "value >= 10000");
    emit("cluster.actor_spawn", "per_actor_p50", quantile(per_actor, 0.5), "us",
         "ask round trip to an agent process, p50 (this run)", floor_us, "report");
  }

  // kill -9 of an actor's worker -> the actor answers again (restarted in a
  // new worker process, with its snapshot).
  {
    const int rounds = quick ? 5 : 30;
    std::vector<double> back_ms;
    for (int r = 0; r < rounds; ++r) {
      // The ref spawn returns follows the actor; the ask sent right after
      // the kill waits for (or is retried on) the next incarnation.
      auto info = cluster->spawn_info<Tally>({.max_restarts = -1, .max_task_retries = 1, .dedicated_process = true}, 0);
      if (!info) return fail("spawn: " + info.error().to_string());
      auto ref = cluster->follow<Tally>(*info);
      auto pid = ref ? ref->ask(WhichPid{}).get() : troupe::Result<int64_t>(troupe::error(ref.error()));
      if (!pid || !ref->ask(Hit{}).get()) return fail("first ask failed");
      auto k0 = Clock::now();
      ::kill(static_cast<pid_t>(*pid), SIGKILL);
      auto n = ref->ask(Hit{}, std::chrono::seconds(10)).get();
      if (!n) return fail("the actor did not answer again: " + n.error().to_string());
      if (*n != 2) return fail("the restarted actor lost its state: " + std::to_string(*n));
      double took = ms_since(k0);
      back_ms.push_back(took);
      (void)cluster->kill_actor(info->id);
    }
    emit("cluster.worker_kill9_to_answer", "p50", quantile(back_ms, 0.5), "ms",
         "Ray: a restarted actor starts a new worker process (no published figure)", 0, "value <= 300 ms");
    emit("cluster.worker_kill9_to_answer", "p99", quantile(back_ms, 0.99), "ms", "same", 0, "report");
  }

  // kill -9 of an agent -> the head declares its node dead.
  auto killed = Clock::now();
  agents[3]->kill9();
  double dead_ms = -1;
  while (ms_since(killed) < 10000) {
    auto st = cluster->status();
    bool dead = false;
    for (auto& n : st ? st->nodes : std::vector<troupe::NodeInfo>{}) dead |= n.id == "a3" && n.state == "dead";
    if (dead) {
      dead_ms = ms_since(killed);
      break;
    }
  }
  emit("cluster.node_death_detected", "kill9_to_dead", dead_ms, "ms",
       "Ray default: ~15000 ms (3 s health-check period x 5 failures)", 15000, "value <= 2000 ms");

  // kill -9 of the head -> restarted on its data dir -> every agent has
  // found it again and a placement group made before the crash is ready.
  troupe::PlacementGroupSpec keep;
  keep.strategy = troupe::PlacementStrategy::strict_spread;
  keep.bundles.assign(3, troupe::Bundle{{{"CPU", 1}}});
  auto kept = cluster->create_placement_group(keep);
  if (!kept || !cluster->wait_placement_group(*kept, std::chrono::seconds(10))) return fail("keep group");
  local.head().kill9();
  auto restarted = Clock::now();
  if (!local.restart_head(kToken, port)) return fail("head restart: " + local.head().said());
  double recovered_ms = -1;
  while (ms_since(restarted) < 20000) {
    auto c = troupe::ClusterClient::connect(rt, address, std::chrono::seconds(1));
    if (!c) continue;
    auto st = c->status();
    if (!st) continue;
    int back = 0;
    for (auto& n : st->nodes) back += n.state == "alive" && n.connected;
    if (back == 3 && c->wait_placement_group(*kept, std::chrono::seconds(1))) {
      recovered_ms = ms_since(restarted);
      break;
    }
  }
  emit("cluster.head_recovery", "restart_to_recovered", recovered_ms, "ms",
       "Ray: actor and placement-group creation stop until the head is back (no published recovery time)", 0,
       "report");
  return errors == 0 ? 0 : 1;
}
