// Actor meshes on a real local cluster (a head and 2 node agents started with
// the `troupe` command line, a driver in this process; the mesh's processes
// are this executable, started by the agents):
//   - call latency (every member's reply) to meshes of 1, 8 and 64 actors
//     (64 as 8 per process on 8 processes), p50/p99;
//   - cast latency: from the cast until every member has acknowledged it
//     (each member tells a collector in the driver), same meshes.
// Floor, in the same run: one ask round trip to the single member of the
// 1-actor mesh.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "../common/report.h"
#include "../common/local_cluster.h"
#include "troupe/cluster.h"
#include "troupe/mesh.h"
#include "troupe/worker.h"

using troupe::bench::emit;
using troupe::bench::quantile;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kToken = "mesh-bench-token";

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

struct Ping {
  TROUPE_MESSAGE_NAMED(Ping, "bench.mesh.Ping");
};
struct Ack {
  TROUPE_MESSAGE_NAMED(Ack, "bench.mesh.Ack");
};
struct CastPing {
  troupe::AnyRef ack_to;
  TROUPE_MESSAGE_NAMED(CastPing, "bench.mesh.CastPing", ack_to);
};

class Echo : public troupe::Actor<Echo, Ping, CastPing> {
 public:
  int handle(const Ping&) { return 1; }
  void handle(const CastPing& m) { (void)m.ack_to.tell(Ack{}); }
};

/// Counts acknowledgements in the driver; completes a promise at the count.
struct Expect {
  size_t n = 0;
  std::shared_ptr<std::promise<void>> done;
};
class Collector : public troupe::Actor<Collector, Expect, Ack> {
 public:
  void handle(const Expect& e) {
    want_ = e.n;
    got_ = 0;
    done_ = e.done;
  }
  void handle(const Ack&) {
    if (++got_ == want_ && done_) {
      done_->set_value();
      done_.reset();
    }
  }

 private:
  size_t want_ = 0, got_ = 0;
  std::shared_ptr<std::promise<void>> done_;
};

}  // namespace

int main(int argc, char** argv) {
  troupe::serve_if_worker();  // the agents start this executable as the mesh's processes
  bool quick = troupe::bench::quick(argc, argv);
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "mesh_bench: %s\n", why.c_str());
    return 1;
  };
  troupe::bench::LocalCluster local("mesh-bench", kToken, 2, "8");
  if (!local.error().empty()) return fail(local.error());
  troupe::RuntimeConfig cfg;
  cfg.cluster_token = kToken;
  cfg.log_level = "error";
  cfg.listen = "tcp://127.0.0.1:0";
  troupe::Runtime rt(cfg);
  auto cluster = troupe::ClusterClient::connect(rt, local.head().address());
  if (!cluster) return fail(cluster.error().to_string());

  auto group = [&](size_t n) {
    troupe::PlacementGroupSpec spec;
    spec.strategy = troupe::PlacementStrategy::spread;
    spec.bundles.assign(n, troupe::Bundle{{{"CPU", 1}}});
    return cluster->create_placement_group(spec);
  };
  auto pg1 = group(1), pg8 = group(8);
  if (!pg1 || !pg8) return fail("placement groups");
  auto procs1 = troupe::ProcMesh::create(*cluster, troupe::Shape::make({{"procs", 1}}).value(), *pg1);
  auto procs8 = troupe::ProcMesh::create(*cluster, troupe::Shape::make({{"hosts", 2}, {"procs", 4}}).value(), *pg8);
  if (!procs1 || !procs8) return fail("proc meshes: " + (!procs1 ? procs1 : procs8).error().to_string());
  auto m1 = procs1->spawn<Echo>({});
  auto m8 = procs8->spawn<Echo>({});
  auto m64 = procs8->spawn_per_process<Echo>(8, "local", {});
  if (!m1 || !m8 || !m64) return fail("actor meshes");

  // Floor: one ask round trip to one member.
  const int rounds = quick ? 100 : 1000;
  std::vector<double> floor_us;
  auto one = m1->member(0);
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    if (!one.ask(Ping{}).get()) return fail("floor ask failed");
    floor_us.push_back(us_since(t0));
  }
  double floor_p50 = quantile(floor_us, 0.5);

  auto collector = rt.spawn<Collector>();
  auto measure = [&](const troupe::ActorMesh<Echo>& mesh, const std::string& n) -> bool {
    std::vector<double> call_us, cast_us;
    for (int i = 0; i < rounds; ++i) {
      auto t0 = Clock::now();
      if (!mesh.call(Ping{}).ok()) return false;
      call_us.push_back(us_since(t0));
    }
    for (int i = 0; i < rounds; ++i) {
      auto done = std::make_shared<std::promise<void>>();
      auto arrived = done->get_future();
      (void)collector.tell(Expect{mesh.size(), done});
      auto t0 = Clock::now();
      if (!mesh.cast(CastPing{collector}).ok()) return false;
      if (arrived.wait_for(std::chrono::seconds(10)) != std::future_status::ready) return false;
      cast_us.push_back(us_since(t0));
    }
    std::string base = "one ask round trip to one member, p50 (this run)";
    emit("mesh.call", "p50_n" + n, quantile(call_us, 0.5), "us", base, floor_p50, "report");
    emit("mesh.call", "p99_n" + n, quantile(call_us, 0.99), "us", base, floor_p50, "report");
    emit("mesh.cast_all_acked", "p50_n" + n, quantile(cast_us, 0.5), "us", base, floor_p50, "report");
    emit("mesh.cast_all_acked", "p99_n" + n, quantile(cast_us, 0.99), "us", base, floor_p50, "report");
    return true;
  };
  if (!measure(*m1, "1") || !measure(*m8, "8") || !measure(*m64, "64")) return fail("a call or cast failed");
  return 0;
}
