// CPU allreduce inside an actor mesh, across real processes: a head and 2
// node agents started with the `troupe` command line, meshes of 4 and 8
// worker processes (this executable, started by the agents), float32 sum of
// 1 MiB to 256 MiB; then the same over two "hosts" (2 agents with different
// TROUPE_HOST_ID, whose processes share no memory): hierarchical (each
// host's arena, rings between the hosts) against the ring over all ranks
// (BENCH_COLLECTIVES_TWO_HOSTS_ONLY=1 runs only that part,
// BENCH_COLLECTIVES_ONE_HOST_ONLY=1 only the first), and there
// reduce_scatter and allgather too (by columns against the flat ring),
// broadcast from rank 0 (chunks down a tree or chain between the hosts'
// leaders and each host's arena, against the same over all ranks), and
// the allreduce pipelined in pieces against the same in one piece. Reported as nccl-tests does: bus bandwidth = algorithm
// bandwidth (bytes / time) x 2(n-1)/n, against the machine's memcpy
// bandwidth measured in the same run. Each size runs four times: on a group
// that goes through its host arena (the default for ranks on one host,
// "arena"), the same with every member's buffer a CollectiveBuffer, read in
// place by the others ("arena_in_place"), on one that runs the ring through
// shared-memory slots ("shm", GroupOptions::host_arena = false), and on one
// that keeps the ring's chunks in messages over the transport ("messages",
// as between hosts); BENCH_COLLECTIVES_PATH=arena, =arena_in_place, =shm or
// =messages runs only one (a list separated by commas, those). Before the
// sizes, each path's latency: an allreduce of one float against a mesh call
// that does nothing, p50 and p99.
// BENCH_TRANSPORT=ucx runs the cluster over UCX instead of TCP. For profiling
// one case: BENCH_COLLECTIVES_MIB=64 (one size), BENCH_COLLECTIVES_N=4,
// BENCH_COLLECTIVES_CHUNK_KIB=256 (GroupOptions::chunk_bytes),
// BENCH_COLLECTIVES_PIECES=32 (GroupOptions::pipeline_pieces of the pipelined path).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../common/report.h"
#include "../common/local_cluster.h"
#include "troupe/collective_buffer.h"
#include "troupe/collective_group.h"
#include "troupe/mesh.h"
#include "troupe/worker.h"

using troupe::bench::emit;
using troupe::bench::quantile;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kToken = "collectives-bench-token";

/// Group `which` (a path's index) of this member; `registered`: its
/// collectives run on a CollectiveBuffer (read in place by the host's other
/// ranks), not on ordinary memory.
struct SetGroup {
  troupe::CollectiveGroup group;
  uint32_t which = 0;
  bool registered = false;
  TROUPE_MESSAGE_NAMED(SetGroup, "bench.coll.SetGroup", group, which, registered);
};
struct Run {
  uint64_t count = 0;
  uint32_t which = 0;
  uint8_t kind = 0;  // troupe::CollectiveKind
  TROUPE_MESSAGE_NAMED(Run, "bench.coll.Run", count, which, kind);
};
/// Answered at once: a mesh call's round trip, the floor of a small
/// collective's latency.
struct Ping {
  TROUPE_MESSAGE_NAMED(Ping, "bench.coll.Ping");
};

/// A member: keeps a buffer of the size asked for and runs the collective
/// asked for on it (a float32 sum).
class Reducer : public troupe::Actor<Reducer, SetGroup, Run, Ping> {
 public:
  void handle(const Ping&) {}
  void handle(const SetGroup& m) {
    groups_[m.which % kPaths] = m.group;
    registered_[m.which % kPaths] = m.registered;
  }
  troupe::Deferred<void> handle(const Run& m) {
    auto reply = defer<void>();
    const uint32_t which = m.which % kPaths;
    float* data = nullptr;
    if (registered_[which]) {
      if (shared_.size() != m.count * sizeof(float)) {
        auto b = troupe::CollectiveBuffer::allocate(std::max<size_t>(1, m.count) * sizeof(float));
        if (!b) {
          reply.fail(b.error());
          return reply;
        }
        shared_ = std::move(*b);
        std::ranges::fill(shared_.as<float>(), 1.0f);
      }
      data = shared_.as<float>().data();
    } else {
      if (buf_.size() != m.count) buf_.assign(m.count, 1.0f);
      data = buf_.data();
    }
    const troupe::CollectiveGroup& group = groups_[which];
    ask<void>(group.engine(self()),
              troupe::Collective{group.id, group.rank, data, m.count, troupe::DType::float32,
                                 troupe::ReduceOp::sum, static_cast<troupe::CollectiveKind>(m.kind), 0},
              std::chrono::minutes(5))
        .then([reply](troupe::Result<void> r) mutable { r ? reply.complete() : reply.fail(r.error()); });
    return reply;
  }

 private:
  static constexpr uint32_t kPaths = 4;
  troupe::CollectiveGroup groups_[kPaths];
  bool registered_[kPaths] = {};
  std::vector<float> buf_;
  troupe::CollectiveBuffer shared_;
};

/// One way of making the bench's groups: its name in the metrics and its options.
struct Path {
  const char* name;
  troupe::GroupOptions options;
  /// Members' buffers are CollectiveBuffers.
  bool registered = false;
};

/// What one mesh measured: per path, the 1-float allreduce latencies (us)
/// and the busbw (bytes/s) of each kind and size; and the do-nothing
/// call's latencies.
struct Measured {
  std::vector<double> floor_us;
  std::vector<std::vector<double>> latency_us;   // by path
  std::vector<std::vector<double>> busbw_bps;    // by path, by kind then size (kind k, size s at k * sizes + s)
};

/// nccl-tests' bus bandwidth factor of a collective over n ranks: the
/// fraction of the buffer each rank's link must carry, per the
/// bandwidth-optimal algorithm.
double bus_factor(troupe::CollectiveKind kind, size_t n) {
  if (kind == troupe::CollectiveKind::broadcast) return 1;  // every rank's link carries the buffer once
  double f = static_cast<double>(n - 1) / static_cast<double>(n);
  return kind == troupe::CollectiveKind::allreduce ? 2 * f : f;
}

/// Runs the collectives (`kinds`, float32 sum) on a mesh of `n` processes
/// of `cluster`, one per bundle of `bundle_cpus` CPUs placed by `strategy`,
/// one group per path (at most 4), into `out`; what failed, or "".
std::string measure(troupe::ClusterClient& cluster, size_t n, troupe::PlacementStrategy strategy, double bundle_cpus,
                    const std::vector<Path>& paths, const std::vector<troupe::CollectiveKind>& kinds,
                    const std::vector<size_t>& sizes_mib, bool quick, Measured& out) {
  auto fail = [](const std::string& why) { return why; };
  troupe::PlacementGroupSpec spec;
  spec.strategy = strategy;
  spec.bundles.assign(n, troupe::Bundle{{{"CPU", bundle_cpus}}});
  auto pg = cluster.create_placement_group(spec);
  if (!pg) return fail(pg.error().to_string());
  auto procs = troupe::ProcMesh::create(cluster, troupe::Shape::make({{"procs", n}}).value(), *pg);
  if (!procs) return fail(procs.error().to_string());
  auto mesh = procs->spawn<Reducer>({});
  if (!mesh) return fail(mesh.error().to_string());
  for (uint32_t which = 0; which < paths.size(); ++which) {
    troupe::GroupOptions options = paths[which].options;
    options.timeout = std::chrono::minutes(5);
    if (const char* e = std::getenv("BENCH_COLLECTIVES_CHUNK_KIB")) options.chunk_bytes = std::stoul(e) << 10;
    if (const char* e = std::getenv("BENCH_COLLECTIVES_PIECES"); e != nullptr && options.pipeline_pieces > 1) {
      options.pipeline_pieces = static_cast<uint32_t>(std::stoul(e));
    }
    auto groups = mesh->make_group(options);
    if (!groups) return fail(groups.error().to_string());
    for (size_t i = 0; i < n; ++i) {
      (void)mesh->member(i).ask(SetGroup{(*groups)[i], which, paths[which].registered}).get();
    }
  }
  // Latency: an allreduce of one float, called from the driver like the
  // rest, against a mesh call that does nothing.
  int iters = quick ? 50 : 300;
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    if (!mesh->call(Ping{}).ok()) return fail("ping failed");
    out.floor_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  for (uint32_t which = 0; which < paths.size(); ++which) {
    out.latency_us.emplace_back();
    for (int i = 0; i < iters; ++i) {
      auto t0 = Clock::now();
      auto r = mesh->call(Run{1, which}, std::chrono::minutes(1));
      if (!r.ok()) return fail("allreduce failed: " + r.errors()[0].second.to_string());
      out.latency_us.back().push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
  }
  out.busbw_bps.assign(paths.size(), {});
  for (troupe::CollectiveKind kind : kinds) {
    auto k = static_cast<uint8_t>(kind);
    for (size_t mib : sizes_mib) {
      size_t bytes = mib << 20;
      for (uint32_t which = 0; which < paths.size(); ++which) {
        int runs = mib >= 64 ? 3 : quick ? 3 : 10;
        (void)mesh->call(Run{bytes / 4, which, k}, std::chrono::minutes(5));  // warm-up: buffers allocated, pages touched
        std::vector<double> secs;
        for (int i = 0; i < runs; ++i) {
          auto t0 = Clock::now();
          auto r = mesh->call(Run{bytes / 4, which, k}, std::chrono::minutes(5));
          if (!r.ok()) return fail(std::string(troupe::kind_name(kind)) + " failed: " + r.errors()[0].second.to_string());
          secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        double t = quantile(secs, 0.5);
        out.busbw_bps[which].push_back(bytes / t * bus_factor(kind, n));
      }
    }
  }
  (void)procs->stop();
  (void)cluster.remove_placement_group(*pg);
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  troupe::serve_if_worker();  // the agents start this executable as the mesh's processes
  bool quick = troupe::bench::quick(argc, argv);
  const char* transport_env = std::getenv("BENCH_TRANSPORT");
  std::string transport = transport_env ? transport_env : "tcp";
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "collectives_bench: %s\n", why.c_str());
    return 1;
  };
  double memcpy_bps = troupe::bench::memcpy_bandwidth();
  troupe::RuntimeConfig cfg;
  cfg.cluster_token = kToken;
  cfg.log_level = "error";
  cfg.transport = transport;
  cfg.listen = transport + "://127.0.0.1:0";
  troupe::Runtime rt(cfg);

  std::vector<size_t> sizes_mib = quick ? std::vector<size_t>{1, 16} : std::vector<size_t>{1, 4, 16, 64, 256};
  std::vector<size_t> ns{4, 8};
  if (const char* e = std::getenv("BENCH_COLLECTIVES_MIB")) sizes_mib = {std::stoul(e)};
  if (const char* e = std::getenv("BENCH_COLLECTIVES_N")) ns = {std::stoul(e)};
  std::vector<Path> paths{{"arena", {}},
                          {"arena_in_place", {}, true},
                          {"shm", {.host_arena = false}},
                          {"messages", {.shared_memory = false}}};
  if (const char* only = std::getenv("BENCH_COLLECTIVES_PATH")) {  // one name, or several separated by commas
    std::string list = std::string(",") + only + ",";
    std::erase_if(paths, [&](const Path& p) { return list.find("," + std::string(p.name) + ",") == std::string::npos; });
  }
  auto emit_latency = [&](const char* what, const std::string& suffix, Measured& m, size_t which) {
    for (double q : {0.5, 0.99}) {
      emit(what, std::string(q == 0.5 ? "p50" : "p99") + "_1float" + suffix, quantile(m.latency_us[which], q), "us",
           "mesh call doing nothing (this run, same quantile)", quantile(m.floor_us, q), "report");
    }
  };

  // One host: 2 agents of this machine.
  if (std::getenv("BENCH_COLLECTIVES_TWO_HOSTS_ONLY") == nullptr) {
    troupe::bench::LocalCluster local("collectives-bench", kToken, 2, "8", transport);
    if (!local.error().empty()) return fail(local.error());
    auto cluster = troupe::ClusterClient::connect(rt, local.head().address());
    if (!cluster) return fail(cluster.error().to_string());
    for (size_t n : ns) {
      auto m = std::make_unique<Measured>();
      if (auto why = measure(*cluster, n, troupe::PlacementStrategy::spread, 1, paths, {troupe::CollectiveKind::allreduce},
                             sizes_mib, quick, *m);
          !why.empty()) {
        return fail(why);
      }
      for (size_t which = 0; which < paths.size(); ++which) {
        std::string suffix = "_n" + std::to_string(n) + "_" + transport + "_" + paths[which].name;
        emit_latency("collectives.allreduce_cpu_latency", suffix, *m, which);
        for (size_t k = 0; k < sizes_mib.size(); ++k) {
          emit("collectives.allreduce_cpu", "busbw_" + std::to_string(sizes_mib[k]) + "MiB" + suffix,
               m->busbw_bps[which][k] / 1e9, "GB/s", "memcpy bandwidth of this machine (this run)", memcpy_bps / 1e9,
               sizes_mib[k] >= 64 && std::string(paths[which].name).starts_with("arena") ? "ratio >= 0.5" : "report");
        }
      }
    }
  }

  // Two hosts: agents with different host ids, whose processes share no
  // memory (as on two machines; the link between them is this machine's
  // loopback). Half the ranks on each, in rank order (PACK of bundles half
  // an agent's 8 CPUs each over two: ranks 0..n/2-1 on the first host), as
  // launchers lay ranks out. The default group goes through each host's arena and rings
  // between the hosts; against the ring over all ranks (shared-memory slots
  // within a host, messages between), what a group spread over hosts did
  // before it had arenas.
  if (std::getenv("BENCH_COLLECTIVES_ONE_HOST_ONLY") == nullptr) {
    troupe::bench::LocalCluster local("collectives-bench-2h", kToken, 2, "8", transport, {"host-a", "host-b"});
    if (!local.error().empty()) return fail(local.error());
    auto cluster = troupe::ClusterClient::connect(rt, local.head().address());
    if (!cluster) return fail(cluster.error().to_string());
    // "hierarchical" pipelines a large allreduce in pieces (the default);
    // "stages" runs it in one piece, its stages one after another.
    std::vector<Path> two_host_paths{
        {"hierarchical", {}}, {"ring", {.host_arena = false}}, {"stages", {.pipeline_pieces = 1}}};
    std::vector<size_t> two_host_sizes = quick ? std::vector<size_t>{16} : std::vector<size_t>{16, 64, 256};
    if (const char* e = std::getenv("BENCH_COLLECTIVES_MIB")) two_host_sizes = {std::stoul(e)};
    const std::vector<troupe::CollectiveKind> kinds{troupe::CollectiveKind::allreduce,
                                                    troupe::CollectiveKind::reduce_scatter,
                                                    troupe::CollectiveKind::allgather,
                                                    troupe::CollectiveKind::broadcast};
    for (size_t n : ns) {
      auto m = std::make_unique<Measured>();
      if (auto why = measure(*cluster, n, troupe::PlacementStrategy::pack, 16.0 / static_cast<double>(n), two_host_paths,
                             kinds, two_host_sizes, quick, *m);
          !why.empty()) {
        return fail(why);
      }
      std::string suffix = "_n" + std::to_string(n) + "_2hosts_" + transport;
      emit_latency("collectives.allreduce_cpu_latency", suffix + "_hierarchical", *m, 0);
      emit_latency("collectives.allreduce_cpu_latency", suffix + "_ring", *m, 1);
      for (size_t kind = 0; kind < kinds.size(); ++kind) {
        std::string metric = "collectives." + std::string(troupe::kind_name(kinds[kind])) + "_cpu";
        for (size_t k = 0; k < two_host_sizes.size(); ++k) {
          size_t at = kind * two_host_sizes.size() + k;
          std::string size = "busbw_" + std::to_string(two_host_sizes[k]) + "MiB";
          // Without arenas a broadcast is a tree or chain over all ranks, not a ring.
          bool tree = kinds[kind] == troupe::CollectiveKind::broadcast;
          std::string flat = tree ? "tree or chain over all ranks" : "ring over all ranks";
          emit(metric, size + suffix + "_hierarchical", m->busbw_bps[0][at] / 1e9, "GB/s",
               flat + ", same hosts (this run)", m->busbw_bps[1][at] / 1e9, "report");
          emit(metric, size + suffix + (tree ? "_flat" : "_ring"), m->busbw_bps[1][at] / 1e9, "GB/s",
               "memcpy bandwidth of this machine (this run)", memcpy_bps / 1e9, "report");
          if (kinds[kind] == troupe::CollectiveKind::allreduce) {
            emit(metric, size + suffix + "_pipelined_vs_stages", m->busbw_bps[0][at] / 1e9, "GB/s",
                 "the same, in one piece (stages one after another, this run)", m->busbw_bps[2][at] / 1e9, "report");
          }
        }
      }
    }
  }
  return 0;
}
