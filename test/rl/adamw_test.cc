// AdamW: one step against the formula computed by hand, the schedule's
// shape, clipping, decay only on matrices, and a bad gradient refused.
#include <cmath>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "model/adamw.h"

using namespace troupe::rl::model;

namespace {
ParamLayout small_layout() {
  return ParamLayout::make(GptConfig{.vocab_size = 5, .context_length = 2, .layers = 1, .heads = 1, .channels = 2})
      .value();
}
}  // namespace

TEST_CASE("adamw: the first step is the formula, with decay on matrices only", "[rl][model]") {
  ParamLayout layout = small_layout();
  AdamW opt(layout, AdamWConfig{.learning_rate = 0.1, .weight_decay = 0.5, .clip_norm = 0});
  std::vector<float> p(layout.total(), 2.0f), g(layout.total(), 0.0f);
  g[0] = 0.3f;  // wte.weight[0] (a matrix)
  size_t bias = layout.find("h.0.attn.qkv.bias")->offset;
  g[bias] = -0.3f;
  opt.step(p.data(), g.data());
  // Step 1: mhat = g, vhat = g^2, so the update is lr * (sign(g) + decay).
  CHECK(p[0] == Approx(2.0 - 0.1 * (1.0 + 0.5 * 2.0)).epsilon(1e-5));
  CHECK(p[bias] == Approx(2.0 + 0.1).epsilon(1e-5));   // no decay on a bias
  CHECK(p[1] == Approx(2.0 - 0.1 * 0.5 * 2.0).epsilon(1e-5));  // a matrix with no gradient still decays
  size_t ln = layout.find("h.0.ln_1.weight")->offset;
  CHECK(p[ln] == 2.0f);  // nothing at all on a LayerNorm weight without gradient
}

TEST_CASE("adamw: warm-up is linear and the cosine decays to the floor", "[rl][model]") {
  AdamW opt(small_layout(), AdamWConfig{.learning_rate = 1.0, .warmup_steps = 10, .decay_steps = 110,
                                        .min_lr_fraction = 0.1});
  CHECK(opt.learning_rate(0) == Approx(0.1));
  CHECK(opt.learning_rate(9) == Approx(1.0));
  CHECK(opt.learning_rate(10) == Approx(1.0));
  CHECK(opt.learning_rate(60) == Approx(0.55));  // half way: the mean of 1 and 0.1
  CHECK(opt.learning_rate(110) == Approx(0.1));
  CHECK(opt.learning_rate(1000) == Approx(0.1));
  for (size_t s = 11; s < 110; ++s) CHECK(opt.learning_rate(s) <= opt.learning_rate(s - 1));
}

TEST_CASE("adamw: a gradient above the clip norm is scaled to it, a NaN gradient changes nothing", "[rl][model]") {
  ParamLayout layout = small_layout();
  AdamW opt(layout, AdamWConfig{.clip_norm = 1.0});
  std::vector<float> p(layout.total(), 1.0f), g(layout.total(), 0.0f);
  g[0] = 3.0f;
  g[1] = 4.0f;
  CHECK(opt.step(p.data(), g.data()) == Approx(5.0));
  CHECK(g[0] == Approx(0.6));
  CHECK(g[1] == Approx(0.8));
  auto before = p;
  g[2] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(opt.step(p.data(), g.data())));
  CHECK(p == before);
  CHECK(opt.steps() == 1);
}

TEST_CASE("adamw: shards that each update their range with the global norm give the whole step's bits",
          "[rl][model]") {
  // A layout large enough for several norm blocks, cut at uneven points.
  ParamLayout layout =
      ParamLayout::make(GptConfig{.vocab_size = 64, .context_length = 16, .layers = 2, .heads = 2, .channels = 64})
          .value();
  const size_t n = layout.total();
  AdamWConfig cfg{.learning_rate = 0.01, .weight_decay = 0.1, .clip_norm = 0.5};
  std::vector<float> p0(n), g0(n);
  for (size_t i = 0; i < n; ++i) {
    p0[i] = std::sin(0.37 * static_cast<double>(i));
    g0[i] = 0.01f * std::cos(0.11 * static_cast<double>(i));
  }
  AdamW whole(layout, cfg);
  std::vector<float> p_whole = p0, p_sharded = p0;
  const std::vector<ParamRange> ranges{{0, n / 3 + 7}, {n / 3 + 7, 2 * n / 3 - 5}, {2 * n / 3 - 5, n}};
  std::vector<AdamW> shards;
  for (const auto& r : ranges) shards.emplace_back(layout, cfg, r);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g_whole = g0, g_sharded = g0;
    for (auto& g : g_whole) g *= static_cast<float>(step + 1);
    for (auto& g : g_sharded) g *= static_cast<float>(step + 1);
    const double norm = whole.step(p_whole.data(), g_whole.data());
    CHECK(norm > cfg.clip_norm);  // clipping is part of what must agree
    double sumsq = 0;
    for (const auto& s : shards) sumsq += s.squared_norm(g_sharded.data());
    CHECK(std::sqrt(sumsq) == Approx(norm).epsilon(1e-12));
    // With the same norm the shards' updates are the whole step's, bit for bit.
    for (auto& s : shards) s.apply(p_sharded.data(), g_sharded.data(), norm);
  }
  CHECK(p_sharded == p_whole);
  for (size_t k = 0; k < shards.size(); ++k) {
    CHECK(shards[k].steps() == 3);
    CHECK(shards[k].m() == std::vector<float>(whole.m().begin() + ranges[k].begin, whole.m().begin() + ranges[k].end));
    CHECK(shards[k].v() == std::vector<float>(whole.v().begin() + ranges[k].begin, whole.v().begin() + ranges[k].end));
  }
  // A checkpoint's whole moments restore into a shard as its range's.
  AdamW restored(layout, cfg, ranges[1]);
  REQUIRE(restored.restore(whole.m(), whole.v(), whole.steps()).ok());
  CHECK(restored.m() == shards[1].m());
  CHECK(restored.steps() == 3);
  // Moments of neither size are refused, and nothing changes.
  auto bad = restored.restore(std::vector<float>(5), std::vector<float>(5), 9);
  CHECK(bad.code() == troupe::ErrorCode::invalid_argument);
  CHECK(restored.steps() == 3);
}
