// The policy model's training step on one GPU (rl/model/cuda/gpt_cuda.h):
// forward, backward and AdamW on a GPT-2-small shape (12 layers, 12 heads,
// 768 channels, 1024 positions), in float32, TF32 and bf16 products (bf16
// with the fused attention, and without it as its baseline). It
// reports tokens/s and the achieved TFLOP/s (llm.c's and PaLM's count:
// 6 x parameters per token for the matrix products, position embeddings
// left out as in bench/rl/model_bench.cc, plus the attention's
// 12 x layers x T x C), against cuBLAS's GEMM peak for the same data types
// measured in the same run on a large square product: the ratio is the
// model FLOPs utilisation (MFU).
//
// Two vocabularies: 259 (the byte tokenizer troupe trains with, so the
// number that matters here) and 50304 (GPT-2's, padded as llm.c pads it:
// the shape llm.c's MFU numbers are for, and a larger share of the work in
// one big product, so a higher ratio).
//
// BENCH_ONLY=L12_C768_T1024_B8_V259_bf16 runs that case alone; its timed
// steps are bracketed for `ncu --profile-from-start off`.
//
// Without a GPU it prints one "skipped" line and exits 0, so bench/run goes on.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../common/report.h"
#include "gpu_bench.h"
#include "model/adamw.h"
#include "model/cuda/gpt_cuda.h"
#include "model/gpt.h"

using troupe::bench::emit;
using troupe::bench::quantile;
using namespace troupe::rl::model;
using Clock = std::chrono::steady_clock;

namespace {

int fail(const std::string& why) { return troupe::bench::fail("model_gpu_bench", why); }

constexpr const char* kBench = "rl.model_gpu_train";

/// One precision of the model and the cuBLAS GEMM that is its peak.
struct Mode {
  const char* name;
  GptCudaOptions options;
  cudaDataType gemm_input;
  cublasComputeType_t gemm_compute;
};

const Mode kModes[] = {
    {"fp32", {.device = 0, .bf16_matmuls = false, .tf32 = false}, CUDA_R_32F, CUBLAS_COMPUTE_32F},
    {"tf32", {.device = 0, .bf16_matmuls = false, .tf32 = true}, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
    {"bf16", {.device = 0, .bf16_matmuls = true, .tf32 = false}, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
    // The baseline of the fused attention (flash_attention.cuh).
    {"bf16_unfused",
     {.device = 0, .bf16_matmuls = true, .tf32 = false, .fused_attention = false},
     CUDA_R_16BF,
     CUBLAS_COMPUTE_32F},
};
constexpr size_t kBf16Mode = 2, kBf16UnfusedMode = 3;

/// Device memory, freed on scope exit.
struct DeviceBytes {
  void* ptr = nullptr;
  explicit DeviceBytes(size_t n) {
    if (cudaMalloc(&ptr, n) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBytes() {
    if (ptr != nullptr) (void)cudaFree(ptr);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

/// cuBLAS's TF/s on C (n,n) float32 = A (n,n) x B (n,n) with A and B of the
/// mode's input type: the best of 3 timings of `reps` back-to-back calls, on
/// random data (zeros would draw less power and flatter the peak).
std::optional<double> gemm_peak_tflops(const Mode& mode, size_t n, int reps, std::string* why) {
  const size_t count = n * n, in_size = mode.gemm_input == CUDA_R_16BF ? 2 : 4;
  DeviceBytes a(count * in_size), b(count * in_size), c(count * 4);
  if (a.ptr == nullptr || b.ptr == nullptr || c.ptr == nullptr) {
    *why = "cudaMalloc of the GEMM operands failed";
    return std::nullopt;
  }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> host(count);
  for (float& x : host) x = dist(rng);
  for (void* dst : {a.ptr, b.ptr}) {
    cudaError_t e = cudaSuccess;
    if (in_size == 2) {
      std::vector<__nv_bfloat16> h16(count);
      for (size_t i = 0; i < count; ++i) h16[i] = __float2bfloat16(host[i]);
      e = cudaMemcpy(dst, h16.data(), count * 2, cudaMemcpyHostToDevice);
    } else {
      e = cudaMemcpy(dst, host.data(), count * 4, cudaMemcpyHostToDevice);
    }
    if (e != cudaSuccess) {
      *why = std::string("copying the GEMM operands: ") + cudaGetErrorString(e);
      return std::nullopt;
    }
  }
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    *why = "cublasCreate failed";
    return std::nullopt;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  (void)cudaEventCreate(&start);
  (void)cudaEventCreate(&stop);
  const float alpha = 1, beta = 0;
  const int dim = static_cast<int>(n);
  auto gemm = [&] {
    return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, dim, dim, dim, &alpha, a.ptr, mode.gemm_input, dim, b.ptr,
                        mode.gemm_input, dim, &beta, c.ptr, CUDA_R_32F, dim, mode.gemm_compute, CUBLAS_GEMM_DEFAULT);
  };
  double best = 0;
  cublasStatus_t status = gemm();  // warm-up: cuBLAS picks its kernel
  for (int trial = 0; trial < 3 && status == CUBLAS_STATUS_SUCCESS; ++trial) {
    (void)cudaEventRecord(start);
    for (int r = 0; r < reps && status == CUBLAS_STATUS_SUCCESS; ++r) status = gemm();
    (void)cudaEventRecord(stop);
    float ms = 0;
    if (cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      status = CUBLAS_STATUS_EXECUTION_FAILED;
      break;
    }
    best = std::max(best, 2.0 * static_cast<double>(n) * n * n * reps / (ms * 1e-3) / 1e12);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  (void)cublasDestroy(handle);
  if (status != CUBLAS_STATUS_SUCCESS) {
    *why = std::string("cublasGemmEx: ") + cublasGetStatusString(status);
    return std::nullopt;
  }
  return best;
}

struct Shape {
  GptConfig config;
  size_t B, T;
  std::string name;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = troupe::bench::quick(argc, argv);
  if (troupe::bench::skipped_without_gpu(kBench, "model_gpu_bench")) return 0;

  // The GEMM peaks first, on an otherwise idle GPU.
  const size_t gemm_n = quick ? 4096 : 8192;
  // A mode whose products are an earlier mode's (bf16_unfused: bf16's)
  // shares its peak: peak_of[i] is the mode that measured it.
  double peaks[std::size(kModes)] = {};
  size_t peak_of[std::size(kModes)] = {};
  for (size_t i = 0; i < std::size(kModes); ++i) {
    peak_of[i] = i;
    for (size_t j = 0; j < i; ++j) {
      if (kModes[j].gemm_input == kModes[i].gemm_input && kModes[j].gemm_compute == kModes[i].gemm_compute) {
        peak_of[i] = j;
        break;
      }
    }
    if (peak_of[i] != i) {
      peaks[i] = peaks[peak_of[i]];
      continue;
    }
    std::string why;
    auto peak = gemm_peak_tflops(kModes[i], gemm_n, quick ? 5 : 20, &why);
    if (!peak) return fail(std::string(kModes[i].name) + " GEMM peak: " + why);
    peaks[i] = *peak;
    emit(kBench, std::string("cublas_gemm_peak_") + kModes[i].name, *peak, "TFLOP/s", "", 0,
         "report (n=" + std::to_string(gemm_n) + ")");
  }

  std::vector<Shape> shapes;
  if (quick) {
    shapes.push_back({{.vocab_size = 259, .context_length = 256, .layers = 4, .heads = 4, .channels = 256},
                      4,
                      256,
                      "L4_C256_T256_B4_V259"});
  } else {
    shapes.push_back({{.vocab_size = 259, .context_length = 1024, .layers = 12, .heads = 12, .channels = 768},
                      8,
                      1024,
                      "L12_C768_T1024_B8_V259"});
    shapes.push_back({{.vocab_size = 50304, .context_length = 1024, .layers = 12, .heads = 12, .channels = 768},
                      8,
                      1024,
                      "L12_C768_T1024_B8_V50304"});
  }
  const int steps = quick ? 3 : 10;
  for (const Shape& shape : shapes) {
    const GptConfig& cfg = shape.config;
    const size_t N = shape.B * shape.T;
    std::vector<float> params;
    {
      auto cpu = Gpt<float>::make(cfg);
      if (!cpu) return fail(cpu.error().to_string());
      cpu->init_random(1);
      params.assign(cpu->params(), cpu->params() + cpu->layout().total());
    }
    std::mt19937 rng(2);
    const auto vocab_used = static_cast<uint32_t>(std::min<size_t>(cfg.vocab_size, 256));
    std::vector<int32_t> tokens(N), targets(N);
    for (size_t i = 0; i < N; ++i) {
      tokens[i] = static_cast<int32_t>(rng() % vocab_used);
      targets[i] = static_cast<int32_t>(rng() % vocab_used);
    }
    std::vector<float> dlosses(N, 1.0f / static_cast<float>(N)), losses(N);
    const AdamWConfig opt{};
    // Matrix products: 6 flops per parameter per token, the position
    // embeddings left out (a lookup, not a product); attention: 12 x L x T x C.
    const double C = static_cast<double>(cfg.channels), L = static_cast<double>(cfg.layers);
    const double matmul_params = static_cast<double>(params.size() - cfg.context_length * cfg.channels);
    const double flops_per_token = 6.0 * matmul_params + 12.0 * L * static_cast<double>(shape.T) * C;

    double step_seconds[std::size(kModes)] = {};
    for (size_t m = 0; m < std::size(kModes); ++m) {
      const Mode& mode = kModes[m];
      if (!troupe::bench::selected(shape.name + "_" + mode.name)) continue;
      auto made = GptCuda::make(cfg, mode.options);
      if (!made) return fail(made.error().to_string());
      GptCuda model = std::move(*made);
      if (troupe::Status s = model.upload_params(params.data()); !s.ok()) return fail(s.to_string());
      auto step = [&]() -> troupe::Status {
        if (troupe::Status s = model.forward(tokens.data(), targets.data(), shape.B, shape.T); !s.ok()) return s;
        if (troupe::Status s = model.zero_grad(); !s.ok()) return s;
        if (troupe::Status s = model.backward(dlosses.data()); !s.ok()) return s;
        auto norm = model.adamw_step(opt);
        if (!norm) return norm.error();
        return model.synchronize();
      };
      for (int w = 0; w < 2; ++w) {  // warm-up: activations allocated, cuBLAS's choices made
        if (troupe::Status s = step(); !s.ok()) return fail(s.to_string());
      }
      std::vector<double> secs;
      (void)cudaProfilerStart();  // under `ncu --profile-from-start off`, only the timed steps
      for (int i = 0; i < steps; ++i) {
        auto t0 = Clock::now();
        if (troupe::Status s = step(); !s.ok()) return fail(s.to_string());
        secs.push_back(troupe::bench::seconds_since(t0));
      }
      (void)cudaProfilerStop();
      if (troupe::Status s = model.losses(losses.data()); !s.ok()) return fail(s.to_string());
      for (float x : losses) {
        if (!std::isfinite(x)) return fail(shape.name + " " + mode.name + ": a non-finite loss");
      }
      const double t = quantile(secs, 0.5);
      step_seconds[m] = t;
      const double tokens_per_s = static_cast<double>(N) / t;
      const double tflops = flops_per_token * tokens_per_s / 1e12;
      const std::string metric = shape.name + "_" + mode.name;
      emit(kBench, "tokens_per_s_" + metric, tokens_per_s, "tokens/s", "", 0, "report");
      emit(kBench, "tflops_" + metric, tflops, "TFLOP/s",
           std::string("cuBLAS ") + kModes[peak_of[m]].name + " GEMM peak (n=" + std::to_string(gemm_n) + "), this run",
           peaks[m],
           "ratio (MFU) >= 0.4");
    }
    if (step_seconds[kBf16Mode] > 0 && step_seconds[kBf16UnfusedMode] > 0) {
      emit(kBench, "step_s_" + shape.name + "_bf16_fused_attention", step_seconds[kBf16Mode], "s",
           "bf16 with the unfused attention (cuBLAS TF32 on the (T,T) scores), this run",
           step_seconds[kBf16UnfusedMode], "report (ratio < 1: fused is faster)");
    }
  }
  return 0;
}
