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

TEST_CASE("adamw: a gradient above the clip norm is scaled to it; a NaN gradient changes nothing", "[rl][model]") {
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
