// NCCL through troupe's communicator (runtime/src/collectives/nccl_comm.h) on
// one GPU: float32 allreduce sum, in place, 1 MiB to 256 MiB, against a
// device-to-device cudaMemcpy of the same size measured in the same run; and
// the host cost of one enqueue() against one cudaMemcpyAsync launch.
//
// One GPU means a single-rank communicator, where the bus bandwidth factor
// 2(n-1)/n of nccl-tests is 0 and NCCL moves no data between ranks: what this
// reports is algorithm bandwidth (bytes / time) of NCCL's one-rank path and
// the overhead troupe's layer (polls, events, pointer checks) adds per call.
// Multi-GPU bus bandwidth needs several GPUs and is not measured here.
//
// Without a GPU it prints one "skipped" line and exits 0, so bench/run goes on.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../common/report.h"
#include "collectives/nccl_comm.h"
#include "gpu_bench.h"

using troupe::CollectiveKind;
using troupe::DType;
using troupe::ReduceOp;
using troupe::bench::emit;
using troupe::bench::quantile;
using troupe::collectives::NcclComm;
using troupe::collectives::Poll;
using Clock = std::chrono::steady_clock;

namespace {

int fail(const std::string& why) { return troupe::bench::fail("nccl_bench", why); }

constexpr const char* kBench = "collectives.allreduce_nccl";
constexpr auto kDeadline = std::chrono::seconds(60);

/// Polls until not pending or the deadline passes (the communicator is
/// poll-only by design; the deadline keeps a hang from stalling bench/run).
template <class F>
Poll wait_for(F&& poll) {
  auto deadline = Clock::now() + kDeadline;
  Poll p = poll();
  while (p.pending() && Clock::now() < deadline) {
    std::this_thread::yield();
    p = poll();
  }
  return p;
}

/// Seconds per copy of `bytes` device to device: `iters` back-to-back
/// cudaMemcpyAsync on one stream, timed on the host like the allreduce.
double memcpy_seconds(void* dst, const void* src, size_t bytes, int iters, cudaStream_t stream) {
  (void)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);  // warm-up
  (void)cudaStreamSynchronize(stream);
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) (void)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  (void)cudaStreamSynchronize(stream);
  return troupe::bench::seconds_since(t0) / iters;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = troupe::bench::quick(argc, argv);
  if (troupe::bench::skipped_without_gpu(kBench, "nccl_bench")) return 0;

  auto id = troupe::collectives::nccl_unique_id();
  if (!id) return fail(id.error().to_string());
  auto started = NcclComm::start(*id, 0, 1, 0);
  if (!started) return fail(started.error().to_string());
  std::unique_ptr<NcclComm> comm = std::move(*started);
  if (Poll init = wait_for([&] { return comm->init_state(); }); !init.done()) {
    return fail("init: " + (init.pending() ? std::string("still pending at the deadline") : init.status.to_string()));
  }

  std::vector<size_t> sizes_mib = quick ? std::vector<size_t>{1, 16} : std::vector<size_t>{1, 4, 16, 64, 256};
  size_t max_bytes = sizes_mib.back() << 20;
  void* buf = nullptr;
  void* copy_dst = nullptr;
  if (cudaMalloc(&buf, max_bytes) != cudaSuccess || cudaMalloc(&copy_dst, max_bytes) != cudaSuccess) {
    return fail("cudaMalloc of the benchmark buffers failed");
  }
  (void)cudaMemset(buf, 0, max_bytes);
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return fail("cudaStreamCreate failed");

  // avg, not sum: on one rank NCCL skips an in-place sum altogether (no
  // kernel), while avg scales every element: one read and one write of the
  // buffer, the traffic of the device-to-device copy it is set against.
  auto allreduce = [&](size_t bytes) {
    return comm->enqueue(CollectiveKind::allreduce, buf, bytes / 4, DType::float32, ReduceOp::avg, 0);
  };
  for (size_t mib : sizes_mib) {
    size_t bytes = mib << 20;
    int iters = quick ? 5 : mib >= 64 ? 20 : 100;
    if (troupe::Status s = allreduce(bytes); !s.ok()) return fail(s.to_string());  // warm-up
    if (Poll p = wait_for([&] { return comm->done_state(); }); !p.done()) return fail(p.status.to_string());
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      if (troupe::Status s = allreduce(bytes); !s.ok()) return fail(s.to_string());
    }
    if (Poll p = wait_for([&] { return comm->done_state(); }); !p.done()) return fail(p.status.to_string());
    double t = troupe::bench::seconds_since(t0) / iters;
    double copy_t = memcpy_seconds(copy_dst, buf, bytes, iters, stream);
    emit(kBench, "algbw_" + std::to_string(mib) + "MiB_n1", bytes / t / 1e9, "GB/s",
         "cudaMemcpy device to device (this run)", bytes / copy_t / 1e9, "report");
  }

  // Host cost of one call: enqueue() of one element (pointer check, NCCL's
  // enqueue, event record) against one cudaMemcpyAsync launch of 4 bytes.
  int launches = quick ? 200 : 2000;
  std::vector<double> enqueue_us, memcpy_us;
  for (int i = 0; i < launches; ++i) {
    auto t0 = Clock::now();
    troupe::Status s = allreduce(4);
    auto t1 = Clock::now();
    if (!s.ok()) return fail(s.to_string());
    if (Poll p = wait_for([&] { return comm->done_state(); }); !p.done()) return fail(p.status.to_string());
    enqueue_us.push_back(troupe::bench::us_between(t0, t1));
    t0 = Clock::now();
    (void)cudaMemcpyAsync(copy_dst, buf, 4, cudaMemcpyDeviceToDevice, stream);
    t1 = Clock::now();
    (void)cudaStreamSynchronize(stream);
    memcpy_us.push_back(troupe::bench::us_between(t0, t1));
  }
  emit(kBench, "launch_us_p50", quantile(enqueue_us, 0.5), "us", "cudaMemcpyAsync launch (this run)",
       quantile(memcpy_us, 0.5), "report");

  (void)cudaStreamDestroy(stream);
  (void)cudaFree(copy_dst);
  (void)cudaFree(buf);
  return 0;
}
