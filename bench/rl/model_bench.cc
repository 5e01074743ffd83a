// The policy model's CPU training step (forward, backward, AdamW) on this
// machine: tokens/s and the achieved GFLOP/s (6 x parameters per token for
// the matrix products, plus the attention's 12 x layers x T x C), against
// OpenBLAS's sgemm GFLOP/s on the model's largest matrix product (the MLP's,
// B*T x C x 4C) measured in the same run, with OpenBLAS's own threads on
// every core: the roofline. The model runs on the compute threads
// (rl/model/threads.h; --threads N, default every core). Then PPO's step on
// the same shape (a value head, the entropies, all three gradients through
// one backward): its tokens/s against the plain step's, this run.
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../common/blas.h"
#include "../common/report.h"
#include "model/adamw.h"
#include "model/gpt.h"
#include "model/threads.h"

using troupe::bench::emit;
using troupe::bench::quantile;
using troupe::bench::seconds_since;
using troupe::bench::sgemm_gflops;
using namespace troupe::rl::model;
using Clock = std::chrono::steady_clock;

namespace {

/// The N of --threads N, or 0 (every core).
size_t threads_arg(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0) return static_cast<size_t>(std::strtoul(argv[i + 1], nullptr, 10));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = troupe::bench::quick(argc, argv);
  set_compute_threads(threads_arg(argc, argv));
  GptConfig cfg{.vocab_size = 259, .context_length = 128, .layers = 4, .heads = 4, .channels = 256};
  const size_t B = 8, T = 128;
  auto model = Gpt<float>::make(cfg);
  GptConfig ppo_cfg = cfg;
  ppo_cfg.value_head = true;
  auto ppo_model = Gpt<float>::make(ppo_cfg);
  if (!model || !ppo_model) {
    std::fprintf(stderr, "model_bench: %s\n", (model ? ppo_model : model).error().to_string().c_str());
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
  // The median seconds of a step, after a warm-up one (activations sized,
  // pages touched).
  auto median_step = [&](auto&& one_step) {
    one_step();
    std::vector<double> secs;
    for (int i = 0; i < (quick ? 2 : 8); ++i) {
      auto t0 = Clock::now();
      one_step();
      secs.push_back(seconds_since(t0));
    }
    return quantile(secs, 0.5);
  };
  double t = median_step(step);
  const double C = static_cast<double>(cfg.channels), L = static_cast<double>(cfg.layers);
  // Matrix products: 6 flops per parameter per token (forward 2, backward 4),
  // embeddings counted once (their lookup is not a product; the tied output
  // projection is); attention: 6 x 2 x L x T x C per token (scores and
  // values, forward and backward, counted in full as is the convention,
  // though the kernels skip most of the causal zero half).
  double params = static_cast<double>(model->layout().total() - cfg.context_length * cfg.channels);
  double flops_per_token = 6.0 * params + 12.0 * L * static_cast<double>(T) * C;
  double tokens_per_s = static_cast<double>(B * T) / t;
  double gflops = flops_per_token * tokens_per_s / 1e9;
  double roof = sgemm_gflops(B * T, 4 * cfg.channels, cfg.channels, quick ? 3 : 10);
  std::string shape = "L4_C256_T128_B8";
  emit("rl.model_cpu_train", "tokens_per_s_" + shape, tokens_per_s, "tokens/s", "", 0, "report");
  emit("rl.model_cpu_train", "gflops_" + shape, gflops, "GFLOP/s", "OpenBLAS sgemm (B*T x C x 4C), this run", roof,
       "ratio >= 0.5");
  ppo_model->init_random(1);
  AdamW ppo_opt(ppo_model->layout(), AdamWConfig{});
  std::vector<float> dvalues(B * T, 0.5f / static_cast<float>(B * T));
  std::vector<float> dentropy(B * T, -0.01f / static_cast<float>(B * T));
  auto ppo_step = [&] {
    (void)ppo_model->forward(tokens.data(), targets.data(), B, T, {.entropy = true});
    ppo_model->zero_grad();
    ppo_model->backward(dlosses.data(), dvalues.data(), dentropy.data());
    ppo_opt.step(ppo_model->params(), ppo_model->grads());
  };
  double ppo_tokens_per_s = static_cast<double>(B * T) / median_step(ppo_step);
  emit("rl.model_cpu_train", "ppo_tokens_per_s_" + shape, ppo_tokens_per_s, "tokens/s",
       "the plain training step, this run", tokens_per_s, "report");
  emit("rl.model_cpu_train", "compute_threads", static_cast<double>(compute_threads()), "threads", "", 0, "report");
  return 0;
}
