// Weight sync on one GPU: a trainer's resident parameters (a CUDA
// DeviceModel) into a rollout engine's decoder (make_device_decoder) on the
// same GPU, as a colocated job does each step (rl_job.cc: the engine beside
// trainer rank 0 copies from PublishedWeights::device), against two
// references measured in the same run:
//
// - the floor: cudaMemcpy device to device of the same bytes between two
//   buffers of their own;
// - the host path, what every engine did before: the parameters downloaded
//   to the host (the published buffer) and uploaded into the decoder
//   (Decoder::set_weights), over PCIe both ways.
//
// The sync is share_params (a synchronize and the IPC handle) +
// copy_into_standby (which waits for its copy) + take_standby; across
// processes (CUDA IPC) it is the same copy from a mapping, not measured
// here. Two shapes: the main job's model
// (0.4 MB: latency) and the 974 MiB one of the CPU weight-sync benchmark
// (docs/rl.md: bandwidth).
//
// Without a GPU it prints one "skipped" line and exits 0, so bench/run goes on.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../common/report.h"
#include "gpu_bench.h"
#include "model/device_model.h"
#include "model/gpt.h"

using troupe::bench::emit;
using troupe::bench::seconds_since;
using namespace troupe::rl::model;
using Clock = std::chrono::steady_clock;

namespace {

int fail(const std::string& why) { return troupe::bench::fail("weight_sync_gpu_bench", why); }

constexpr const char* kBench = "rl.weight_sync_gpu";

// The best of `runs` timings of `fn` (after one untimed run).
template <class F>
double best_of(int runs, F&& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = troupe::bench::quick(argc, argv);
  if (troupe::bench::skipped_without_gpu(kBench, "weight_sync_gpu_bench")) return 0;
  struct Shape {
    std::string name;
    GptConfig config;
  };
  const Shape shapes[] = {
      {"main job model", {.vocab_size = 259, .context_length = 16, .layers = 2, .heads = 4, .channels = 64}},
      {"974 MiB model (L16 C1152)",
       {.vocab_size = 259, .context_length = 64, .layers = 16, .heads = 16, .channels = 1152}},
  };
  const int runs = quick ? 3 : 10;
  for (const Shape& shape : shapes) {
    auto trainer = make_device_model(shape.config, {.kind = DeviceKind::cuda, .device = 0});
    if (!trainer) return fail(trainer.error().message());
    auto decoder = make_device_decoder(shape.config, 1, {.kind = DeviceKind::cuda, .device = 0});
    if (!decoder) return fail(decoder.error().message());
    auto host = Gpt<float>::make(shape.config);
    if (!host) return fail(host.error().message());
    host->init_random(1);
    if (auto s = (*trainer)->upload_params(host->params()); !s.ok()) return fail(s.message());
    if (auto s = (*decoder)->set_weights(*host); !s.ok()) return fail(s.message());
    const size_t bytes = host->layout().total() * sizeof(float);

    bool ok = true;
    const double direct = best_of(runs, [&] {
      auto shared = (*trainer)->share_params();
      ok = ok && shared && (*decoder)->copy_into_standby(*shared).ok() && (*decoder)->take_standby().ok();
    });
    if (!ok) return fail("the device copy failed");
    const double through_host = best_of(runs, [&] {
      ok = ok && (*trainer)->download_params(host->params()).ok() && (*decoder)->set_weights(*host).ok();
      (void)cudaDeviceSynchronize();  // an upload may return before its copy ends
    });
    if (!ok) return fail("the host path failed");
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
      return fail("cannot allocate the floor's buffers");
    }
    const double floor = best_of(runs, [&] {
      (void)cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
      (void)cudaDeviceSynchronize();
    });
    (void)cudaFree(a);
    (void)cudaFree(b);

    const std::string what = "weight sync on one GPU, " + shape.name;
    emit(kBench, what + ": trainer's device into the decoder's standby", direct, "s",
         "cudaMemcpy device to device, same bytes", floor, "report (ratio: 1 is the floor)");
    emit(kBench, what + ": GB/s", static_cast<double>(bytes) / direct / 1e9, "GB/s", "-", 0, "report");
    emit(kBench, what + ": the host path (download + upload)", through_host, "s",
         "trainer's device into the decoder's standby", direct, "report (ratio: the device copy's speed-up)");
  }
  return 0;
}
