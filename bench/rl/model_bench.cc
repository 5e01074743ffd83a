// The policy model's CPU training step (forward, backward, AdamW) on this
// machine: tokens/s and the achieved GFLOP/s (6 x parameters per token for
// the matrix products, plus the attention's 12 x layers x T x C), against
// OpenBLAS's sgemm GFLOP/s on the model's largest matrix product (the MLP's,
// B*T x C x 4C) measured in the same run: the roofline.
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../common/report.h"
#include "model/adamw.h"
#include "model/gpt.h"

using troupe::bench::emit;
using troupe::bench::quantile;
using namespace troupe::rl::model;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// sgemm GFLOP/s for (M x K) x (K x N), best of `reps`.
double sgemm_gflops(size_t M, size_t N, size_t K, int reps) {
  std::vector<float> a(M * K, 0.5f), b(K * N, 0.25f), c(M * N);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), 1.0f, a.data(), static_cast<int>(K), b.data(), static_cast<int>(K), 0.0f,
                c.data(), static_cast<int>(N));
    best = std::max(best, 2.0 * static_cast<double>(M * N * K) / seconds_since(t0) / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = troupe::bench::quick(argc, argv);
  GptConfig cfg{.vocab_size = 259, .context_length = 128, .layers = 4, .heads = 4, .channels = 256};
  const size_t B = 8, T = 128;
  auto model = Gpt<float>::make(cfg);
  if (!model) {
    std::fprintf(stderr, "model_bench: %s\n", model.error().to_string().c_str());
    return 1;
  }
  model->init_random(1);
  AdamW opt(model->layout(), AdamWConfig{});
  std::mt19937 rng(2);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (size_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>(rng() % 256);
    targets[i] = static_cast<int32_t>(rng() % 256);
  }
  std::vector<float> dlosses(B * T, 1.0f / static_cast<float>(B * T));
  auto step = [&] {
    (void)model->forward(tokens.data(), targets.data(), B, T);
    model->zero_grad();
    model->backward(dlosses.data());
    opt.step(model->params(), model->grads());
  };
  step();  // warm-up: activations sized, pages touched
  std::vector<double> secs;
  for (int i = 0; i < (quick ? 2 : 8); ++i) {
    auto t0 = Clock::now();
    step();
    secs.push_back(seconds_since(t0));
  }
  double t = quantile(secs, 0.5);
  const double C = static_cast<double>(cfg.channels), L = static_cast<double>(cfg.layers);
  // Matrix products: 6 flops per parameter per token (forward 2, backward 4),
  // embeddings counted once (their lookup is not a product; the tied output
  // projection is); attention: 6 x 2 x L x T x C per token (scores and
  // values, forward and backward, the causal half of it done as full here).
  double params = static_cast<double>(model->layout().total() - cfg.context_length * cfg.channels);
  double flops_per_token = 6.0 * params + 12.0 * L * static_cast<double>(T) * C;
  double tokens_per_s = static_cast<double>(B * T) / t;
  double gflops = flops_per_token * tokens_per_s / 1e9;
  double roof = sgemm_gflops(B * T, 4 * cfg.channels, cfg.channels, quick ? 3 : 10);
  std::string shape = "L4_C256_T128_B8";
  emit("rl.model_cpu_train", "tokens_per_s_" + shape, tokens_per_s, "tokens/s", "", 0, "report");
  emit("rl.model_cpu_train", "gflops_" + shape, gflops, "GFLOP/s", "OpenBLAS sgemm (B*T x C x 4C), this run", roof,
       "ratio >= 0.5");
  return 0;
}
