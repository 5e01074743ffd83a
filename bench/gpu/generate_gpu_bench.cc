// The policy model's generation on one GPU (make_device_decoder: the KV
// cache and decode steps on the device, sampling on the host): new tokens/s
// at batch 1 and 64, in float32 and bf16 products, each against floors
// measured in the same run:
//
// - the memory-bound limit: a decode step reads every weight once, so at
//   best a step takes (weight bytes / the device's copy bandwidth), with
//   the bandwidth from cudaMemcpy device-to-device on 256 MiB here;
// - for the small model, the CPU's generation (generate_bench.cc's shape)
//   with every core of this machine: the ratio is the GPU's speed-up.
//
// Two shapes: generate_bench.cc's (4 layers, 256 channels: what the
// examples train) and GPT-2 small's (12 x 768, 1024 positions), where the
// weights, not the launches, set the pace.
//
// BENCH_ONLY=L12_C768_batch64 runs those cases alone; their timed runs are
// bracketed for `ncu --profile-from-start off`.
//
// Without a GPU it prints one "skipped" line and exits 0, so bench/run goes on.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "../common/report.h"
#include "gpu_bench.h"
#include "model/device_model.h"
#include "model/generate.h"
#include "model/threads.h"

using troupe::bench::emit;
using troupe::bench::quantile;
using troupe::bench::seconds_since;
using namespace troupe::rl::model;
using Clock = std::chrono::steady_clock;
using troupe::Status;

namespace {

int fail(const std::string& why) { return troupe::bench::fail("generate_gpu_bench", why); }

constexpr const char* kBench = "rl.model_gpu_generate";

/// Device-to-device copy bandwidth in bytes/s (each byte read and written
/// counts once, as a decode reads its weights once): best of 5 copies of
/// 256 MiB. 0 when the device cannot allocate it.
double copy_bandwidth() {
  const size_t bytes = size_t{256} << 20;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    (void)cudaFree(a);
    return 0;
  }
  double best = 1e30;
  (void)cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);  // warm-up
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    (void)cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    (void)cudaDeviceSynchronize();
    best = std::min(best, seconds_since(t0));
  }
  (void)cudaFree(a);
  (void)cudaFree(b);
  // A copy reads and writes every byte: 2 x bytes of traffic.
  return 2.0 * static_cast<double>(bytes) / best;
}

std::vector<std::vector<int32_t>> make_prompts(size_t batch, size_t len) {
  std::vector<std::vector<int32_t>> prompts(batch);
  for (size_t i = 0; i < batch; ++i) {
    for (size_t t = 0; t < len; ++t) prompts[i].push_back(static_cast<int32_t>((i * 31 + t * 7) % 256));
  }
  return prompts;
}

/// Median new tokens/s of generate() on `decoder` over `reps` runs (after
/// a warm-up), or 0 with `why` set.
double tokens_per_s(Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts, size_t new_tokens, int reps,
                    std::string* why) {
  // Temperature 1, no stop token: every sequence makes exactly new_tokens.
  SamplingParams params{.temperature = 1.0, .max_new_tokens = new_tokens, .seed = 3};
  if (auto w = generate(decoder, prompts, params); !w) {
    *why = w.error().to_string();
    return 0;
  }
  std::vector<double> secs;
  (void)cudaProfilerStart();  // under `ncu --profile-from-start off`, only the timed runs
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    auto out = generate(decoder, prompts, params);
    secs.push_back(seconds_since(t0));
    if (!out) {
      (void)cudaProfilerStop();
      *why = out.error().to_string();
      return 0;
    }
  }
  (void)cudaProfilerStop();
  return static_cast<double>(prompts.size() * new_tokens) / quantile(secs, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = troupe::bench::quick(argc, argv);
  if (troupe::bench::skipped_without_gpu(kBench, "generate_gpu_bench")) return 0;
  const double bandwidth = copy_bandwidth();
  if (bandwidth <= 0) return fail("cannot allocate 512 MiB for the bandwidth floor");
  emit(kBench, "device_copy_bandwidth", bandwidth / 1e9, "GB/s", "", 0, "report");
  const size_t cpu_threads = std::max(1u, std::thread::hardware_concurrency());

  struct Shape {
    std::string name;
    GptConfig config;
    bool cpu_floor;
  };
  const Shape shapes[] = {
      {"L4_C256", {.vocab_size = 259, .context_length = 128, .layers = 4, .heads = 4, .channels = 256}, true},
      {"L12_C768", {.vocab_size = 259, .context_length = 1024, .layers = 12, .heads = 12, .channels = 768}, false},
  };
  const size_t prompt_len = 16;
  for (const Shape& shape : shapes) {
    auto model = Gpt<float>::make(shape.config);
    if (!model) return fail(model.error().to_string());
    model->init_random(1);
    const size_t new_tokens = std::min<size_t>(quick ? 32 : 112, shape.config.context_length - prompt_len);
    const double weight_bytes = static_cast<double>(model->layout().total()) * sizeof(float);
    for (size_t batch : {size_t{1}, size_t{64}}) {
      const auto prompts = make_prompts(batch, prompt_len);
      const std::string tag = shape.name + "_batch" + std::to_string(batch) + "_new" + std::to_string(new_tokens);
      if (!troupe::bench::selected(tag)) continue;
      double cpu = 0;
      if (shape.cpu_floor) {
        set_compute_threads(cpu_threads);
        auto cache = KvCache::make(shape.config, batch).value();
        cache.set_batch_invariant(false);  // the CPU's fastest: one BLAS product per step
        if (Status s = cache.set_weights(*model); !s.ok()) return fail(s.to_string());
        std::string why;
        cpu = tokens_per_s(cache, prompts, new_tokens, quick ? 1 : 3, &why);
        if (cpu == 0) return fail(why);
      }
      for (auto [name, precision] : {std::pair{"fp32", MatmulPrecision::fp32}, std::pair{"bf16", MatmulPrecision::bf16}}) {
        auto dec = make_device_decoder(shape.config, batch, {.kind = DeviceKind::cuda, .device = 0, .precision = precision});
        if (!dec) return fail(dec.error().to_string());
        if (Status s = (*dec)->set_weights(*model); !s.ok()) return fail(s.to_string());
        std::string why;
        const double gpu = tokens_per_s(**dec, prompts, new_tokens, quick ? 1 : 3, &why);
        if (gpu == 0) return fail(why);
        // At best one read of the weights per step, for `batch` tokens.
        const double roofline = static_cast<double>(batch) * bandwidth / weight_bytes;
        emit(kBench, "tokens_per_s_" + tag + "_" + name, gpu, "tokens/s",
             "memory-bound limit (weights once per step at the copy bandwidth)", roofline, "report");
        if (shape.cpu_floor) {
          emit(kBench, "tokens_per_s_" + tag + "_" + name + "_vs_cpu", gpu, "tokens/s",
               "CPU generate, " + std::to_string(cpu_threads) + " threads, this run", cpu, "report");
        }
      }
    }
  }
  return 0;
}
