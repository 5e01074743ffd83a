// PPO's parts of the policy model: the value head (layout, initialisation,
// its gradient through the shared trunk) and the entropy of the next-token
// distribution (value and gradient), each backward in double against
// central finite differences for every parameter; generation ignores the
// head.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "model/generate.h"
#include "model/gpt.h"
#include "model/kv_cache.h"
#include "model/losses.h"

using namespace troupe::rl::model;

namespace {

GptConfig tiny(bool tied, bool value_head) {
  return GptConfig{.vocab_size = 13, .context_length = 6, .layers = 2, .heads = 2, .channels = 8,
                   .tied_embeddings = tied, .value_head = value_head};
}

const size_t kB = 2, kT = 5;
const std::vector<int32_t> kTokens = {1, 5, 2, 12, 0, 7, 7, 3, 9, 4};
const std::vector<int32_t> kTargets = {5, 2, 12, 0, 3, 7, 3, 9, 4, 11};

/// A double model with weights larger than GPT-2's init (so that every path
/// carries signal), the value head included.
Gpt<double> random_model(bool tied, bool value_head) {
  auto m = Gpt<double>::make(tiny(tied, value_head)).value();
  m.init_random(7);
  for (size_t i = 0; i < m.layout().total(); ++i) m.params()[i] *= 10;
  if (value_head) {
    for (size_t c = 0; c <= m.config().channels; ++c) {
      m.params()[m.layout().value_head_w() + c] = 0.3 * std::sin(1.0 + static_cast<double>(c));
    }
  }
  return m;
}

/// The worst relative difference, over every parameter, between the
/// model's gradient (already in grads()) and central differences of `loss`.
std::pair<double, std::string> worst_gradient_error(Gpt<double>& m, const std::function<double()>& loss) {
  std::vector<double> analytic(m.grads(), m.grads() + m.layout().total());
  const double eps = 1e-6;
  double worst = 0;
  std::string at = "none";
  for (const TensorSpec& t : m.layout().tensors()) {
    for (size_t i = 0; i < t.count; ++i) {
      double& x = m.params()[t.offset + i];
      const double keep = x;
      x = keep + eps;
      const double up = loss();
      x = keep - eps;
      const double down = loss();
      x = keep;
      const double numeric = (up - down) / (2 * eps);
      const double diff = std::abs(numeric - analytic[t.offset + i]) / std::max(1.0, std::abs(numeric));
      if (diff > worst) {
        worst = diff;
        at = t.name + "[" + std::to_string(i) + "]";
      }
    }
  }
  return {worst, at};
}

}  // namespace

TEST_CASE("value head: its tensors come last, every policy tensor keeps its offset", "[rl][model][value_head]") {
  for (bool tied : {true, false}) {
    INFO("tied embeddings " << tied);
    auto policy = ParamLayout::make(tiny(tied, false)).value();
    auto critic = ParamLayout::make(tiny(tied, true)).value();
    const size_t C = 8;
    CHECK(policy.policy_count() == policy.total());
    CHECK(critic.policy_count() == policy.total());
    CHECK(critic.total() == policy.total() + C + 1);
    REQUIRE(critic.tensors().size() == policy.tensors().size() + 2);
    for (size_t i = 0; i < policy.tensors().size(); ++i) {
      const TensorSpec &a = policy.tensors()[i], &b = critic.tensors()[i];
      INFO(a.name);
      CHECK(a.name == b.name);
      CHECK(a.offset == b.offset);
      CHECK(a.shape == b.shape);
    }
    const TensorSpec& w = critic.tensors()[critic.tensors().size() - 2];
    const TensorSpec& b = critic.tensors().back();
    CHECK(w.name == "value_head.weight");
    CHECK(w.shape == std::vector<size_t>{C});
    CHECK(w.offset == critic.policy_count());
    CHECK(critic.value_head_w() == w.offset);
    CHECK(b.name == "value_head.bias");
    CHECK(b.shape == std::vector<size_t>{1});
    CHECK(critic.value_head_b() == w.offset + C);
    CHECK(critic.find("value_head.bias") == &b);
    CHECK(policy.find("value_head.weight") == nullptr);
    CHECK_FALSE(tiny(tied, true) == tiny(tied, false));
  }
}

TEST_CASE("value head: it starts at zero, the policy's initialisation and outputs are unchanged",
          "[rl][model][value_head]") {
  auto with = Gpt<float>::make(tiny(true, true)).value();
  auto without = Gpt<float>::make(tiny(true, false)).value();
  with.init_random(5);
  without.init_random(5);
  const size_t P = without.layout().total();
  CHECK(std::equal(without.params(), without.params() + P, with.params()));
  for (size_t i = P; i < with.layout().total(); ++i) CHECK(with.params()[i] == 0.0f);
  REQUIRE(with.forward(kTokens.data(), kTargets.data(), kB, kT).ok());
  REQUIRE(without.forward(kTokens.data(), kTargets.data(), kB, kT).ok());
  for (size_t i = 0; i < kB * kT; ++i) {
    CHECK(with.losses()[i] == without.losses()[i]);
    CHECK(with.values()[i] == 0.0f);
  }
  // The bias alone: every position's value is it.
  with.params()[with.layout().value_head_b()] = 0.75f;
  REQUIRE(with.forward(kTokens.data(), kTargets.data(), kB, kT).ok());
  for (size_t i = 0; i < kB * kT; ++i) CHECK(with.values()[i] == 0.75f);
}

TEST_CASE("value head: a value is ln_f's output dotted with the head, float agrees with double",
          "[rl][model][value_head]") {
  // ln_f with weight 0 and bias beta outputs beta at every position: the
  // value is then beta . w + b, whatever the trunk computed.
  auto m = random_model(true, true);
  const size_t C = 8;
  double expect = m.params()[m.layout().value_head_b()];
  for (size_t c = 0; c < C; ++c) {
    m.params()[m.layout().lnf_w() + c] = 0;
    m.params()[m.layout().lnf_b() + c] = 0.1 * static_cast<double>(c) - 0.2;
    expect += m.params()[m.layout().lnf_b() + c] * m.params()[m.layout().value_head_w() + c];
  }
  REQUIRE(m.forward(kTokens.data(), kTargets.data(), kB, kT).ok());
  for (size_t i = 0; i < kB * kT; ++i) CHECK(m.values()[i] == Approx(expect).epsilon(1e-12));

  auto md = random_model(false, true);
  auto mf = Gpt<float>::make(tiny(false, true)).value();
  for (size_t i = 0; i < md.layout().total(); ++i) mf.params()[i] = static_cast<float>(md.params()[i]);
  REQUIRE(md.forward(kTokens.data(), kTargets.data(), kB, kT, {.entropy = true}).ok());
  REQUIRE(mf.forward(kTokens.data(), kTargets.data(), kB, kT, {.entropy = true}).ok());
  for (size_t i = 0; i < kB * kT; ++i) {
    CHECK(mf.values()[i] == Approx(md.values()[i]).margin(1e-5).epsilon(1e-4));
    CHECK(mf.entropies()[i] == Approx(md.entropies()[i]).margin(1e-5).epsilon(1e-4));
  }
}

TEST_CASE("value head: d (token losses + value loss) / d params matches finite differences (double)",
          "[rl][model][value_head]") {
  const std::vector<double> dlosses = {0.1, -0.2, 0.3, 0.05, 1.0, 0.0, 0.4, -0.7, 0.2, 0.9};
  const std::vector<double> returns = {0.5, -1.0, 2.0, 0.3, -0.4, 1.1, 0.0, -2.0, 0.7, 0.2};
  const std::vector<double> mask = {0, 1, 1, 1, 1, 0, 0, 1, 1, 1};
  for (bool tied : {true, false}) {
    for (bool with_token_losses : {true, false}) {
      INFO("tied " << tied << ", token losses " << with_token_losses);
      auto m = random_model(tied, true);
      REQUIRE(m.forward(kTokens.data(), kTargets.data(), kB, kT).ok());
      // Old values near the current ones, so that the clip binds on some
      // tokens and not on others.
      std::vector<double> old_values(m.values(), m.values() + kB * kT);
      for (size_t i = 0; i < old_values.size(); ++i) old_values[i] += (i % 3 == 0 ? 0.5 : -0.05);
      const ValueLossConfig config{.value_clip = 0.2, .aggregation = LossAggregation::sequence_mean};
      std::vector<double> dvalues(kB * kT);
      auto loss = [&] {
        REQUIRE(m.forward(kTokens.data(), kTargets.data(), kB, kT).ok());
        ValueLossInputs<double> in{.B = kB, .T = kT, .values = m.values(), .old_values = old_values.data(),
                                   .returns = returns.data(), .mask = mask.data()};
        double total = value_loss(in, config, dvalues.data()).value().loss;
        if (with_token_losses) {
          for (size_t i = 0; i < kB * kT; ++i) total += dlosses[i] * m.losses()[i];
        }
        return total;
      };
      loss();
      m.zero_grad();
      m.backward(with_token_losses ? dlosses.data() : nullptr, dvalues.data());
      if (!with_token_losses && !tied) {
        // Values alone: the output projection gets no gradient.
        const TensorSpec* lm_head = m.layout().find("lm_head.weight");
        for (size_t i = 0; i < lm_head->count; ++i) REQUIRE(m.grads()[lm_head->offset + i] == 0.0);
      }
      auto [worst, at] = worst_gradient_error(m, loss);
      INFO("worst at " << at);
      CHECK(worst < 1e-6);
    }
  }
}

TEST_CASE("entropy: d (sum dentropy * H) / d params matches finite differences, alone and with the other terms",
          "[rl][model][entropy]") {
  const std::vector<double> dlosses = {0.1, -0.2, 0.3, 0.05, 1.0, 0.0, 0.4, -0.7, 0.2, 0.9};
  const std::vector<double> dentropy = {-0.3, 0.5, 0.0, 1.2, -0.8, 0.25, -0.6, 0.9, 0.1, -0.4};
  const std::vector<double> dvalues = {0.2, 0.0, -0.5, 0.7, 0.3, -0.1, 0.6, 0.0, -0.9, 0.4};
  struct Case {
    bool tied, value_head, all_terms;
  };
  for (Case c :
       {Case{true, false, false}, Case{false, false, false}, Case{true, true, true}, Case{false, true, true}}) {
    INFO("tied " << c.tied << ", value head " << c.value_head << ", all terms " << c.all_terms);
    auto m = random_model(c.tied, c.value_head);
    auto loss = [&] {
      REQUIRE(m.forward(kTokens.data(), kTargets.data(), kB, kT, {.entropy = true}).ok());
      double total = 0;
      for (size_t i = 0; i < kB * kT; ++i) {
        total += dentropy[i] * m.entropies()[i];
        if (c.all_terms) total += dlosses[i] * m.losses()[i] + dvalues[i] * m.values()[i];
      }
      return total;
    };
    loss();
    // H against -sum p log p of the model's own distributions.
    for (size_t i = 0; i < kB * kT; ++i) {
      double h = 0;
      for (size_t v = 0; v < 13; ++v) h -= m.probs()[i * 13 + v] * std::log(m.probs()[i * 13 + v]);
      CHECK(m.entropies()[i] == Approx(h).epsilon(1e-12));
    }
    m.zero_grad();
    m.backward(c.all_terms ? dlosses.data() : nullptr, c.all_terms ? dvalues.data() : nullptr, dentropy.data());
    auto [worst, at] = worst_gradient_error(m, loss);
    INFO("worst at " << at);
    CHECK(worst < 1e-6);
  }
}

TEST_CASE("entropy: the policy loss's entropy bonus reaches the parameters as d loss / d H (double)",
          "[rl][model][entropy]") {
  // The whole chain the trainer runs: forward with entropies, the policy
  // loss with entropy_coef, its two gradients into one backward.
  auto m = random_model(false, false);
  const std::vector<double> mask = {0, 1, 1, 1, 1, 0, 0, 1, 1, 0};
  const std::vector<double> advantages = {0, 0.8, 0.8, 0.8, 0.8, 0, 0, -1.2, -1.2, 0};
  REQUIRE(m.forward(kTokens.data(), kTargets.data(), kB, kT).ok());
  std::vector<double> old(kB * kT);
  for (size_t i = 0; i < old.size(); ++i) old[i] = -m.losses()[i] + (i % 2 == 0 ? 0.1 : -0.15);
  const PolicyLossConfig config{.aggregation = LossAggregation::sequence_sum_over_positions, .entropy_coef = 0.7};
  std::vector<double> logprobs(kB * kT), dlogprobs(kB * kT), dentropy(kB * kT), dlosses(kB * kT);
  auto loss = [&] {
    REQUIRE(m.forward(kTokens.data(), kTargets.data(), kB, kT, {.entropy = true}).ok());
    for (size_t i = 0; i < logprobs.size(); ++i) logprobs[i] = -m.losses()[i];
    PolicyLossInputs<double> in{.B = kB, .T = kT, .logprobs = logprobs.data(), .old_logprobs = old.data(),
                                .advantages = advantages.data(), .mask = mask.data(), .entropies = m.entropies()};
    return policy_gradient_loss(in, config, dlogprobs.data(), dentropy.data()).value().loss;
  };
  loss();
  to_model_dlosses(dlosses.data(), dlogprobs.data(), dlosses.size());
  m.zero_grad();
  m.backward(dlosses.data(), nullptr, dentropy.data());
  auto [worst, at] = worst_gradient_error(m, loss);
  INFO("worst at " << at);
  CHECK(worst < 1e-6);
}

TEST_CASE("value head: the KV cache and generation ignore it (the policy prefix decides)", "[rl][model][value_head]") {
  GptConfig with_head{
      .vocab_size = 37, .context_length = 16, .layers = 2, .heads = 4, .channels = 32, .value_head = true};
  GptConfig without = with_head;
  without.value_head = false;
  auto critic = Gpt<float>::make(with_head).value();
  auto policy = Gpt<float>::make(without).value();
  critic.init_random(9);
  for (size_t i = critic.layout().policy_count(); i < critic.layout().total(); ++i) critic.params()[i] = 1.5f;
  std::copy(critic.params(), critic.params() + critic.layout().policy_count(), policy.params());

  auto a = KvCache::make(critic.config(), 2).value();
  auto b = KvCache::make(policy.config(), 2).value();
  std::vector<DecodeRow> rows = {{0, 3}, {0, 8}, {1, 5}};
  std::vector<float> la(rows.size() * 37), lb(rows.size() * 37), lc(rows.size() * 37);
  REQUIRE(a.append(critic, rows, la.data()).ok());
  REQUIRE(b.append(policy, rows, lb.data()).ok());
  CHECK(la == lb);
  // A policy's cache takes the model with a head too: the head touches no cache.
  b.clear_all();
  REQUIRE(b.append(critic, rows, lc.data()).ok());
  CHECK(lc == lb);

  SamplingParams sampling{.temperature = 0, .max_new_tokens = 6, .seed = 1};
  std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {4}};
  auto ga = generate(critic, a, prompts, sampling);
  auto gb = generate(policy, b, prompts, sampling);
  REQUIRE(ga.has_value());
  REQUIRE(gb.has_value());
  REQUIRE(ga->size() == gb->size());
  for (size_t i = 0; i < ga->size(); ++i) {
    CHECK((*ga)[i].tokens == (*gb)[i].tokens);
    CHECK((*ga)[i].logprobs == (*gb)[i].logprobs);
  }
}
