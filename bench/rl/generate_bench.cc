// The policy model's CPU generation (rl/model/generate.h: KV cache,
// batched decode) on this machine: new tokens/s at batch 1 and batch 64,
// each against a floor measured in the same run:
//
// - batch 1: decoding a token reads every weight once (matrix-vector
//   products); the floor is OpenBLAS sgemv over the same weight matrices
//   (one pass = one token's worth), so the ratio is generation's share of
//   the memory-bound limit;
// - batch 64: the products are (64 x C) x (C x 4C) matrices; the floor is
//   OpenBLAS sgemm GFLOP/s at that shape, against the achieved GFLOP/s of
//   the whole decode (2 flops per parameter per token plus attention),
//   batch-invariant (one matrix-vector product per row, the default) and
//   not (one BLAS product for the 64 rows);
// - the batch-invariant product alone (model/kernels.h), C -> 4C at 1 row
//   and at 64, against sgemv and sgemm of the same shape.
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../common/blas.h"
#include "../common/report.h"
#include "model/generate.h"
#include "model/kernels.h"
#include "model/threads.h"

using troupe::bench::emit;
using troupe::bench::quantile;
using troupe::bench::seconds_since;
using troupe::bench::sgemm_gflops;
using namespace troupe::rl::model;
using Clock = std::chrono::steady_clock;

namespace {

// Seconds for one sgemv pass over every (out, in) weight matrix of the model
// (best of `reps`): the floor of a batch-1 decode step.
double sgemv_pass_seconds(const Gpt<float>& m, int reps) {
  const GptConfig& c = m.config();
  const size_t C = c.channels;
  std::vector<float> x(4 * C, 0.5f), y(std::max(4 * C, c.vocab_size));
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    auto mv = [&](size_t offset, size_t out, size_t in) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0f,
                  m.params() + offset, static_cast<int>(in), x.data(), 1, 0.0f, y.data(), 1);
    };
    for (size_t l = 0; l < c.layers; ++l) {
      const LayerOffsets& o = m.layout().layer(l);
      mv(o.qkv_w, 3 * C, C);
      mv(o.proj_w, C, C);
      mv(o.fc_w, 4 * C, C);
      mv(o.fcproj_w, C, 4 * C);
    }
    mv(m.layout().lm_head(), c.vocab_size, C);
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// Best-of-`reps` GFLOP/s of `product` (2 N C OC flops).
template <typename F>
double product_gflops(size_t N, size_t C, size_t OC, int reps, F&& product) {
  const int calls = static_cast<int>(std::max<size_t>(1, (size_t{1} << 26) / (N * C * OC)));
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) product();
    best = std::max(best, 2.0 * static_cast<double>(N * C * OC) * calls / seconds_since(t0) / 1e9);
  }
  return best;
}

// The batch-invariant product C -> OC alone, at N rows, against BLAS at
// the same shape (sgemv for one row, sgemm for more), both on every core.
void bench_product(size_t N, size_t C, size_t OC, int reps) {
  std::vector<float> in(N * C, 0.5f), w(OC * C, 0.25f), bias(OC, 0.125f), out(N * OC);
  const double invariant = product_gflops(N, C, OC, reps, [&] {
    matmul_forward_invariant(out.data(), in.data(), w.data(), bias.data(), N, C, OC);
  });
  openblas_set_num_threads(static_cast<int>(compute_threads()));
  const double blas = product_gflops(N, C, OC, reps, [&] {
    if (N == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(OC), static_cast<int>(C), 1.0f, w.data(),
                  static_cast<int>(C), in.data(), 1, 0.0f, out.data(), 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(N), static_cast<int>(OC),
                  static_cast<int>(C), 1.0f, in.data(), static_cast<int>(C), w.data(), static_cast<int>(C), 0.0f,
                  out.data(), static_cast<int>(OC));
    }
  });
  const std::string shape = std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(OC);
  emit("rl.model_cpu_generate", "invariant_product_gflops_" + shape, invariant, "GFLOP/s",
       std::string(N == 1 ? "OpenBLAS sgemv" : "OpenBLAS sgemm") + ", same shape, this run", blas, "report");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = troupe::bench::quick(argc, argv);
  GptConfig cfg{.vocab_size = 259, .context_length = 128, .layers = 4, .heads = 4, .channels = 256};
  auto model = Gpt<float>::make(cfg);
  if (!model) {
    std::fprintf(stderr, "generate_bench: %s\n", model.error().to_string().c_str());
    return 1;
  }
  model->init_random(1);
  const size_t prompt_len = 16, new_tokens = quick ? 32 : cfg.context_length - prompt_len;
  const std::string shape = "L4_C256_prompt16_new" + std::to_string(new_tokens);
  const double C = static_cast<double>(cfg.channels), L = static_cast<double>(cfg.layers);
  // Products: 2 flops per weight per token (wpe is a lookup); attention:
  // 4 x L x C flops per cached position (scores and values).
  const double weights = static_cast<double>(model->layout().total() - cfg.context_length * cfg.channels);
  const double mean_positions = static_cast<double>(prompt_len) + static_cast<double>(new_tokens) / 2;
  const double flops_per_token = 2 * weights + 4 * L * C * mean_positions;

  // Batch-invariant decoding (the default: a row's bits do not depend on
  // its batch) and BLAS's one product for all rows (batch_invariant off).
  for (auto [batch, invariant] : {std::pair{size_t{1}, true}, std::pair{size_t{64}, true}, std::pair{size_t{64}, false}}) {
    auto cache = KvCache::make(cfg, batch).value();
    cache.set_batch_invariant(invariant);
    std::vector<std::vector<int32_t>> prompts(batch);
    for (size_t i = 0; i < batch; ++i) {
      for (size_t t = 0; t < prompt_len; ++t) prompts[i].push_back(static_cast<int32_t>((i * 31 + t * 7) % 256));
    }
    // Sampling at temperature 1 with no stop token: every sequence makes
    // exactly new_tokens tokens.
    SamplingParams params{.temperature = 1.0, .max_new_tokens = new_tokens, .seed = 3};
    (void)generate(*model, cache, prompts, params);  // warm-up
    std::vector<double> secs;
    for (int r = 0; r < (quick ? 1 : 3); ++r) {
      auto t0 = Clock::now();
      auto out = generate(*model, cache, prompts, params);
      secs.push_back(seconds_since(t0));
      if (!out) {
        std::fprintf(stderr, "generate_bench: %s\n", out.error().to_string().c_str());
        return 1;
      }
    }
    const double tokens_per_s = static_cast<double>(batch * new_tokens) / quantile(secs, 0.5);
    const std::string metric =
        "tokens_per_s_batch" + std::to_string(batch) + "_" + shape + (invariant ? "" : "_not_batch_invariant");
    if (batch == 1) {
      const double floor_tokens_per_s = 1.0 / sgemv_pass_seconds(*model, quick ? 5 : 20);
      emit("rl.model_cpu_generate", metric, tokens_per_s, "tokens/s", "OpenBLAS sgemv over the weights (1 pass/token)",
           floor_tokens_per_s, "report");
    } else {
      emit("rl.model_cpu_generate", metric, tokens_per_s, "tokens/s", "", 0, "report");
      const double gflops = tokens_per_s * flops_per_token / 1e9;
      emit("rl.model_cpu_generate", "gflops_batch64_" + shape + (invariant ? "" : "_not_batch_invariant"), gflops,
           "GFLOP/s",
           "OpenBLAS sgemm (64 x C x 4C), this run", sgemm_gflops(batch, 4 * cfg.channels, cfg.channels, 10),
           "report");
    }
  }
  for (size_t rows : {size_t{1}, size_t{64}}) bench_product(rows, cfg.channels, 4 * cfg.channels, quick ? 3 : 10);
  return 0;
}
