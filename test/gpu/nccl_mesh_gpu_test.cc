// Collectives on CUDA memory inside an actor mesh: the members hand device
// buffers to their engines, which run them on the group's NCCL
// communicator (made by the runtime: unique id from rank 0's engine,
// non-blocking init). On one GPU a one-process mesh is the whole of what
// NCCL allows; a two-process mesh is correct where there are two GPUs and,
// where there is one, fails on both ranks with NCCL's reason within the
// group's deadline (two ranks on one device are refused), never hangs.
#include <cuda_runtime_api.h>

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/local_cluster.h"
#include "troupe/collective_group.h"
#include "troupe/mesh.h"

using namespace std::chrono_literals;
using troupe::CollectiveKind;
using troupe::DType;
using troupe::ReduceOp;
using namespace troupe::test;

namespace {

struct SetGpuGroup {
  troupe::CollectiveGroup group;
  TROUPE_MESSAGE_NAMED(SetGpuGroup, "test.gpu.SetGroup", group);
};
/// Puts rank r's pattern in a device buffer of `count` floats, runs the
/// collective on it, and answers with the buffer copied back.
struct GpuRun {
  uint64_t count = 0;
  uint8_t kind = 0;
  uint8_t op = 0;
  uint32_t root = 0;
  TROUPE_MESSAGE_NAMED(GpuRun, "test.gpu.Run", count, kind, op, root);
};

float pattern(uint32_t rank, size_t i) { return static_cast<float>((rank + 1) * 3 + static_cast<int>(i % 11)); }

class GpuMember : public troupe::Actor<GpuMember, SetGpuGroup, GpuRun> {
 public:
  ~GpuMember() override {
    if (device_buf_ != nullptr) cudaFree(device_buf_);
  }
  void handle(const SetGpuGroup& m) { group_ = m.group; }

  troupe::Deferred<std::vector<float>> handle(const GpuRun& m) {
    auto reply = defer<std::vector<float>>();
    int devices = 0;
    cudaGetDeviceCount(&devices);
    device_ = devices > 0 ? static_cast<int>(group_.rank) % devices : 0;
    cudaSetDevice(device_);
    if (device_buf_ != nullptr) cudaFree(device_buf_);
    device_buf_ = nullptr;
    std::vector<float> host(m.count);
    for (size_t i = 0; i < m.count; ++i) host[i] = pattern(group_.rank, i);
    if (cudaMalloc(&device_buf_, m.count * sizeof(float)) != cudaSuccess ||
        cudaMemcpy(device_buf_, host.data(), m.count * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
      reply.fail(troupe::Status(troupe::ErrorCode::handler_failed, "cuda: could not fill the device buffer"));
      return reply;
    }
    ask<void>(group_.engine(self()),
              troupe::Collective{group_.id, group_.rank, device_buf_, m.count, DType::float32,
                                 static_cast<ReduceOp>(m.op), static_cast<CollectiveKind>(m.kind), m.root},
              120s)
        .then([this, reply, count = m.count](troupe::Result<void> r) mutable {
          if (!r) return reply.fail(r.error());
          std::vector<float> out(count);
          cudaSetDevice(device_);  // the continuation may run on another thread
          if (cudaMemcpy(out.data(), device_buf_, count * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
            return reply.fail(troupe::Status(troupe::ErrorCode::handler_failed, "cuda: could not read back"));
          }
          reply.complete(std::move(out));
        });
    return reply;
  }

 private:
  troupe::CollectiveGroup group_;
  int device_ = 0;
  void* device_buf_ = nullptr;
};

/// A mesh of `n` worker processes on one agent, a GpuMember in each, and a
/// group given to them.
struct GpuMesh {
  LocalCluster local{1};
  size_t n;
  std::string pg;
  troupe::ProcMesh procs;
  troupe::ActorMesh<GpuMember> mesh;

  GpuMesh(size_t processes, std::chrono::milliseconds timeout)
      : n(processes),
        pg([&] {
          troupe::PlacementGroupSpec spec;
          spec.bundles.assign(processes, troupe::Bundle{{{"CPU", 0.5}}});
          return local.cluster.create_placement_group(spec).value();
        }()),
        procs(troupe::ProcMesh::create(local.cluster, troupe::Shape::make({{"gpus", processes}}).value(), pg).value()),
        mesh(procs.spawn<GpuMember>({}).value()) {
    auto groups = mesh.make_group(timeout).value();
    for (size_t i = 0; i < n; ++i) REQUIRE(mesh.member(i).ask(SetGpuGroup{groups[i]}).get().has_value());
  }

  troupe::ValueMesh<std::vector<float>> run(CollectiveKind kind, size_t count, ReduceOp op = ReduceOp::sum,
                                           uint32_t root = 0) {
    return mesh.call(GpuRun{count, static_cast<uint8_t>(kind), static_cast<uint8_t>(op), root}, 180s);
  }
};

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace

TEST_CASE("nccl mesh: a one-process mesh runs every collective on CUDA memory through the engine's communicator",
          "[gpu][nccl][cluster]") {
  GpuMesh g(1, 60s);
  for (size_t count : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    INFO("count " << count);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      auto r = g.run(CollectiveKind::allreduce, count, op);
      REQUIRE(r.ok());
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) wrong += (*r[0])[i] != pattern(0, i);  // one rank: its own values
      CHECK(wrong == 0);
    }
    for (CollectiveKind kind : {CollectiveKind::broadcast, CollectiveKind::allgather, CollectiveKind::reduce_scatter}) {
      auto r = g.run(kind, count);
      REQUIRE(r.ok());
      CHECK((*r[0])[count - 1] == pattern(0, count - 1));
    }
  }
}

TEST_CASE("nccl mesh: two processes allreduce on two GPUs, or both fail with NCCL's reason on one GPU, never hang",
          "[gpu][nccl][cluster]") {
  GpuMesh g(2, 30s);
  auto t0 = std::chrono::steady_clock::now();
  auto r = g.run(CollectiveKind::allreduce, 4096, ReduceOp::sum);
  if (device_count() >= 2) {
    REQUIRE(r.ok());
    for (size_t m = 0; m < 2; ++m) {
      size_t wrong = 0;
      for (size_t i = 0; i < 4096; ++i) wrong += (*r[m])[i] != pattern(0, i) + pattern(1, i);
      CHECK(wrong == 0);
    }
    // Counts the two ranks do not divide are refused (NCCL's layout) without breaking the group.
    auto odd = g.run(CollectiveKind::reduce_scatter, 4097);
    REQUIRE_FALSE(odd.ok());
    CHECK_THAT(odd.errors()[0].second.message(), Catch::Contains("multiple of the group size"));
    CHECK(g.run(CollectiveKind::allreduce, 10).ok());
  } else {
    REQUIRE(r.errors().size() == 2);
    for (auto& [index, why] : r.errors()) {
      INFO("member " << index << ": " << why.to_string());
      CHECK_THAT(why.message(), Catch::Contains("NCCL"));
    }
    // Within the group's deadline (30 s) plus the call's overheads.
    CHECK(std::chrono::steady_clock::now() - t0 < 60s);
  }
}
