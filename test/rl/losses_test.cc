// The RL losses: their gradients match finite differences (alone, and
// through the whole model in double), PPO's clipping zeroes exactly the
// gradients it should, the KL estimators have their values, the
// aggregations weigh tokens as documented, bad settings are refused. Then
// PPO's additions: the entropy bonus and the clipped value loss against
// written-out references and finite differences.
#include <cmath>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "model/gpt.h"
#include "model/losses.h"

using namespace troupe::rl::model;

namespace {

// B = 3 rows of T = 5: prompts of different lengths masked out, and a padded tail.
const std::vector<double> kMask = {0, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1};

struct Batch {
  size_t B = 3, T = 5;
  std::vector<double> lp, old, ref, adv, mask;
  PolicyLossInputs<double> inputs() const {
    return {.B = B, .T = T, .logprobs = lp.data(), .old_logprobs = old.data(), .ref_logprobs = ref.data(),
            .advantages = adv.data(), .mask = mask.data()};
  }
};

Batch random_batch(uint64_t seed) {
  Batch b;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> lp(-3.0, -0.1), shift(-0.4, 0.4), adv(-1.5, 1.5);
  const size_t n = b.B * b.T;
  for (size_t i = 0; i < n; ++i) {
    b.lp.push_back(lp(rng));
    b.old.push_back(b.lp.back() + shift(rng));  // ratios from about 0.67 to 1.5: some clipped
    b.ref.push_back(b.lp.back() + shift(rng));
  }
  std::vector<double> per_seq;
  for (size_t s = 0; s < b.B; ++s) per_seq.push_back(adv(rng));
  b.adv.resize(n);
  broadcast_advantages(b.adv.data(), per_seq.data(), b.B, b.T);
  b.mask = kMask;
  return b;
}

struct ValueBatch {
  size_t B = 3, T = 5;
  std::vector<double> values, old_values, returns, mask;
  ValueLossInputs<double> inputs() const {
    return {.B = B, .T = T, .values = values.data(), .old_values = old_values.data(), .returns = returns.data(),
            .mask = mask.data()};
  }
};

ValueBatch random_value_batch(uint64_t seed) {
  ValueBatch b;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> v(-1.0, 1.0), shift(-0.5, 0.5), r(-2.0, 2.0);
  for (size_t i = 0; i < b.B * b.T; ++i) {
    b.values.push_back(v(rng));
    b.old_values.push_back(b.values.back() + shift(rng));  // some past the clip of 0.2, some inside
    b.returns.push_back(r(rng));
  }
  b.mask = kMask;
  return b;
}

}  // namespace

TEST_CASE("policy loss: the gradient matches finite differences for every aggregation and KL estimator",
          "[rl][losses]") {
  for (auto agg : {LossAggregation::token_mean, LossAggregation::sequence_mean,
                   LossAggregation::sequence_sum_over_positions}) {
    for (auto kl : {KlEstimator::k1, KlEstimator::k3}) {
      INFO("aggregation " << static_cast<int>(agg) << " kl " << static_cast<int>(kl));
      Batch b = random_batch(3);
      PolicyLossConfig cfg{.clip_low = 0.2, .clip_high = 0.28, .kl_coef = 0.3, .kl_estimator = kl, .aggregation = agg};
      std::vector<double> grad(b.lp.size());
      auto st = policy_gradient_loss(b.inputs(), cfg, grad.data()).value();
      CHECK(st.tokens == 8);
      CHECK(st.clip_fraction > 0);  // the batch exercises the clipped branch
      CHECK(st.clip_fraction < 1);
      std::vector<double> scratch(b.lp.size());
      const double eps = 1e-7;
      for (size_t i = 0; i < b.lp.size(); ++i) {
        double keep = b.lp[i];
        b.lp[i] = keep + eps;
        double up = policy_gradient_loss(b.inputs(), cfg, scratch.data()).value().loss;
        b.lp[i] = keep - eps;
        double down = policy_gradient_loss(b.inputs(), cfg, scratch.data()).value().loss;
        b.lp[i] = keep;
        CHECK(grad[i] == Approx((up - down) / (2 * eps)).margin(1e-7));
        if (b.mask[i] == 0) CHECK(grad[i] == 0);
      }
    }
  }
}

TEST_CASE("policy loss: clipping stops the gradient only where the ratio has moved past the clip in the "
          "advantage's direction",
          "[rl][losses]") {
  // One sequence, four tokens: ratios 1.5, 1.5, 0.5, 0.5 against advantages +1, -1, +1, -1.
  std::vector<double> lp = {std::log(1.5), std::log(1.5), std::log(0.5), std::log(0.5)};
  std::vector<double> old(4, 0.0), adv = {1, -1, 1, -1}, mask(4, 1.0), grad(4);
  PolicyLossInputs<double> in{.B = 1, .T = 4, .logprobs = lp.data(), .old_logprobs = old.data(),
                              .advantages = adv.data(), .mask = mask.data()};
  auto st = policy_gradient_loss(in, PolicyLossConfig{.clip_low = 0.2, .clip_high = 0.2}, grad.data()).value();
  CHECK(grad[0] == 0);                       // A > 0, r above 1 + eps: no further push up
  CHECK(grad[1] == Approx(1.5 / 4));         // A < 0, r above: the unclipped term, pushed down
  CHECK(grad[2] == Approx(-0.5 / 4));        // A > 0, r below: pushed up
  CHECK(grad[3] == 0);                       // A < 0, r below 1 - eps: no further push down
  CHECK(st.clip_fraction == Approx(0.5));
  CHECK(st.ratio_mean == Approx(1.0));
  // loss = mean of max(-A r, -A clip(r)): -1.2, 1.5, -0.5, 0.8.
  CHECK(st.policy_loss == Approx((-1.2 + 1.5 - 0.5 + 0.8) / 4));
}

TEST_CASE("policy loss: on-policy with no KL it is minus the mean advantage, its gradient minus the advantage",
          "[rl][losses]") {
  std::vector<double> lp = {-1, -2, -0.5, -3}, adv = {2, 2, -1, -1}, mask = {1, 1, 1, 0}, grad(4);
  PolicyLossInputs<double> in{.B = 2, .T = 2, .logprobs = lp.data(), .old_logprobs = lp.data(),
                              .advantages = adv.data(), .mask = mask.data()};
  auto tok = policy_gradient_loss(in, PolicyLossConfig{}, grad.data()).value();
  CHECK(tok.loss == Approx(-(2 + 2 - 1) / 3.0));
  CHECK(grad[0] == Approx(-2.0 / 3));
  CHECK(grad[3] == 0);
  CHECK(tok.clip_fraction == 0);
  // Per sequence: sequence 0 counts two tokens, sequence 1 one; each weighs half.
  auto seq = policy_gradient_loss(in, PolicyLossConfig{.aggregation = LossAggregation::sequence_mean}, grad.data())
                 .value();
  CHECK(seq.loss == Approx(-(2.0 + -1.0) / 2));
  CHECK(grad[0] == Approx(-2.0 / 4));
  CHECK(grad[2] == Approx(1.0 / 2));
  auto dr = policy_gradient_loss(
                in, PolicyLossConfig{.aggregation = LossAggregation::sequence_sum_over_positions}, grad.data())
                .value();
  CHECK(dr.loss == Approx(-(4.0 - 1.0) / 4));  // sums over sequences / (B * T)
}

TEST_CASE("policy loss: the KL estimators give their values, k3 never negative and zero at equality",
          "[rl][losses]") {
  std::vector<double> lp = {-1.0, -2.0}, ref = {-1.5, -2.0}, adv = {0, 0}, mask = {1, 1}, grad(2);
  PolicyLossInputs<double> in{.B = 1, .T = 2, .logprobs = lp.data(), .old_logprobs = lp.data(),
                              .ref_logprobs = ref.data(), .advantages = adv.data(), .mask = mask.data()};
  auto k1 = policy_gradient_loss(in, PolicyLossConfig{.kl_coef = 1, .kl_estimator = KlEstimator::k1}, grad.data())
                .value();
  CHECK(k1.kl == Approx(0.5 / 2));
  auto k3 = policy_gradient_loss(in, PolicyLossConfig{.kl_coef = 1, .kl_estimator = KlEstimator::k3}, grad.data())
                .value();
  CHECK(k3.kl == Approx((std::exp(-0.5) + 0.5 - 1) / 2));
  CHECK(grad[1] == 0);  // k3's gradient vanishes where the policies agree
  ref = {-0.2, -2.0};   // reference more likely than the policy: k1 negative, k3 still positive
  auto k1n = policy_gradient_loss(in, PolicyLossConfig{.kl_coef = 1, .kl_estimator = KlEstimator::k1}, grad.data())
                 .value();
  CHECK(k1n.kl < 0);
  auto k3p = policy_gradient_loss(in, PolicyLossConfig{.kl_coef = 1, .kl_estimator = KlEstimator::k3}, grad.data())
                 .value();
  CHECK(k3p.kl > 0);
}

TEST_CASE("policy loss: bad settings and missing inputs are refused", "[rl][losses]") {
  std::vector<double> x(2, -1.0), mask(2, 1.0), grad(2);
  PolicyLossInputs<double> in{.B = 1, .T = 2, .logprobs = x.data(), .old_logprobs = x.data(),
                              .advantages = x.data(), .mask = mask.data()};
  CHECK_THAT(policy_gradient_loss(in, PolicyLossConfig{.kl_coef = 0.1}, grad.data()).error().message(),
             Catch::Contains("ref_logprobs"));
  CHECK_THAT(policy_gradient_loss(in, PolicyLossConfig{.clip_low = 1.0}, grad.data()).error().message(),
             Catch::Contains("clip_low"));
  CHECK_THAT(policy_gradient_loss(in, PolicyLossConfig{.kl_coef = -1}, grad.data()).error().message(),
             Catch::Contains("kl_coef"));
  in.advantages = nullptr;
  CHECK(policy_gradient_loss(in, PolicyLossConfig{}, grad.data()).error().code() ==
        troupe::ErrorCode::invalid_argument);
  CHECK(parse_loss_aggregation("sequence_mean").value() == LossAggregation::sequence_mean);
  CHECK_THAT(parse_loss_aggregation("mean").error().message(), Catch::Contains("token_mean"));
  CHECK(parse_kl_estimator("k3").value() == KlEstimator::k3);
  CHECK_THAT(parse_kl_estimator("k2").error().message(), Catch::Contains("k1 or k3"));
}

TEST_CASE("masked nll: the mean of -logprob over the answer tokens, zero when nothing counts", "[rl][losses]") {
  std::vector<double> lp = {-1, -2, -3, -4}, mask = {0, 1, 1, 0}, grad(4);
  CHECK(masked_nll_loss(lp.data(), mask.data(), 4, grad.data()) == Approx(2.5));
  CHECK(grad == std::vector<double>{0, -0.5, -0.5, 0});
  std::vector<double> none(4, 0.0);
  CHECK(masked_nll_loss(lp.data(), none.data(), 4, grad.data()) == 0);
  CHECK(grad == std::vector<double>(4, 0.0));
}

TEST_CASE("losses through the model: both losses' parameter gradients match finite differences (double)",
          "[rl][losses]") {
  GptConfig cfg{.vocab_size = 11, .context_length = 5, .layers = 1, .heads = 2, .channels = 8};
  auto m = Gpt<double>::make(cfg).value();
  m.init_random(17);
  for (size_t i = 0; i < m.layout().total(); ++i) m.params()[i] *= 10;
  const size_t B = 2, T = 5, n = B * T;
  std::vector<int32_t> tokens = {1, 4, 2, 9, 0, 3, 3, 7, 10, 5}, targets = {4, 2, 9, 0, 6, 3, 7, 10, 5, 1};
  std::vector<double> mask = {0, 0, 1, 1, 1, 0, 1, 1, 1, 0};
  std::vector<double> old(n), ref(n), adv(n), per_seq = {0.8, -1.1};
  broadcast_advantages(adv.data(), per_seq.data(), B, T);
  REQUIRE(m.forward(tokens.data(), targets.data(), B, T).ok());
  for (size_t i = 0; i < n; ++i) {
    old[i] = -m.losses()[i] + 0.15 * std::sin(static_cast<double>(i));  // a policy that has moved a little
    ref[i] = -m.losses()[i] - 0.2 * std::cos(static_cast<double>(i));
  }
  PolicyLossConfig cfg_pg{.kl_coef = 0.2, .kl_estimator = KlEstimator::k3};
  std::vector<double> lp(n), dlp(n), dl(n);
  // loss(params): which: 0 = supervised, 1 = policy gradient.
  auto loss = [&](int which, bool with_grad) {
    REQUIRE(m.forward(tokens.data(), targets.data(), B, T).ok());
    for (size_t i = 0; i < n; ++i) lp[i] = -m.losses()[i];
    double value;
    if (which == 0) {
      value = masked_nll_loss(lp.data(), mask.data(), n, dlp.data());
    } else {
      PolicyLossInputs<double> in{.B = B, .T = T, .logprobs = lp.data(), .old_logprobs = old.data(),
                                  .ref_logprobs = ref.data(), .advantages = adv.data(), .mask = mask.data()};
      value = policy_gradient_loss(in, cfg_pg, dlp.data()).value().loss;
    }
    if (with_grad) {
      to_model_dlosses(dl.data(), dlp.data(), n);
      m.zero_grad();
      m.backward(dl.data());
    }
    return value;
  };
  for (int which : {0, 1}) {
    INFO((which == 0 ? "supervised" : "policy gradient"));
    loss(which, true);
    std::vector<double> analytic(m.grads(), m.grads() + m.layout().total());
    double worst = 0;
    const double eps = 1e-6;
    for (size_t i = 0; i < m.layout().total(); i += 7) {  // every 7th parameter: all tensors, quick
      double& x = m.params()[i];
      double keep = x;
      x = keep + eps;
      double up = loss(which, false);
      x = keep - eps;
      double down = loss(which, false);
      x = keep;
      double numeric = (up - down) / (2 * eps);
      worst = std::max(worst, std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(numeric)));
    }
    CHECK(worst < 1e-6);
  }
}

namespace {

/// The aggregate of per-token values x over the mask, written out for each
/// aggregation (the reference the losses' weights are checked against).
double aggregate(const std::vector<double>& x, const std::vector<double>& mask, size_t B, size_t T,
                 LossAggregation agg) {
  double total = 0, tokens = 0, sequences = 0, per_sequence = 0;
  for (size_t b = 0; b < B; ++b) {
    double sum = 0, count = 0;
    for (size_t t = 0; t < T; ++t) {
      sum += mask[b * T + t] * x[b * T + t];
      count += mask[b * T + t];
    }
    total += sum;
    tokens += count;
    if (count > 0) {
      sequences += 1;
      per_sequence += sum / count;
    }
  }
  switch (agg) {
    case LossAggregation::token_mean:
      return total / tokens;
    case LossAggregation::sequence_mean:
      return per_sequence / sequences;
    case LossAggregation::sequence_sum_over_positions:
      return total / static_cast<double>(B * T);
  }
  return 0;
}

}  // namespace

TEST_CASE("policy loss: the entropy bonus takes away entropy_coef times the aggregated entropy",
          "[rl][losses][entropy]") {
  for (auto agg : {LossAggregation::token_mean, LossAggregation::sequence_mean,
                   LossAggregation::sequence_sum_over_positions}) {
    INFO("aggregation " << static_cast<int>(agg));
    Batch b = random_batch(11);
    std::vector<double> entropies(b.lp.size());
    for (size_t i = 0; i < entropies.size(); ++i) entropies[i] = 0.1 + 0.37 * static_cast<double>(i % 5);
    PolicyLossConfig plain{.kl_coef = 0.1, .aggregation = agg};
    PolicyLossConfig bonus = plain;
    bonus.entropy_coef = 0.03;
    std::vector<double> grad0(b.lp.size()), grad1(b.lp.size()), dentropy(b.lp.size(), 9.0);
    auto in = b.inputs();
    in.entropies = entropies.data();
    auto st0 = policy_gradient_loss(in, plain, grad0.data()).value();
    auto st1 = policy_gradient_loss(in, bonus, grad1.data(), dentropy.data()).value();
    CHECK(st1.loss == Approx(st0.loss - 0.03 * aggregate(entropies, b.mask, b.B, b.T, agg)).epsilon(1e-12));
    CHECK(st1.policy_loss == st0.policy_loss);
    CHECK(st1.kl == st0.kl);
    CHECK(grad1 == grad0);  // the entropy is the model's own input: d loss / d logprob is unchanged
    double masked_sum = 0;
    for (size_t i = 0; i < entropies.size(); ++i) masked_sum += b.mask[i] * entropies[i];
    CHECK(st1.entropy == Approx(masked_sum / st1.tokens));
    CHECK(st0.entropy == st1.entropy);  // reported whenever the entropies are given
    // d loss / d H against finite differences: zero off the mask.
    std::vector<double> scratch(b.lp.size()), scratch_h(b.lp.size());
    const double eps = 1e-6;
    for (size_t i = 0; i < entropies.size(); ++i) {
      const double keep = entropies[i];
      entropies[i] = keep + eps;
      const double up = policy_gradient_loss(in, bonus, scratch.data(), scratch_h.data()).value().loss;
      entropies[i] = keep - eps;
      const double down = policy_gradient_loss(in, bonus, scratch.data(), scratch_h.data()).value().loss;
      entropies[i] = keep;
      CHECK(dentropy[i] == Approx((up - down) / (2 * eps)).margin(1e-9));
      if (b.mask[i] == 0) CHECK(dentropy[i] == 0);
    }
  }
  // By hand, token mean over 3 tokens: entropies 1, 2, 3 (the prompt's 7
  // left out), on-policy advantages 1: loss -1 - 0.5 * 2.
  std::vector<double> lp = {-1, -1, -1, -1}, adv = {0, 1, 1, 1}, mask = {0, 1, 1, 1}, h = {7, 1, 2, 3};
  std::vector<double> grad(4), dh(4);
  PolicyLossInputs<double> in{.B = 1, .T = 4, .logprobs = lp.data(), .old_logprobs = lp.data(),
                              .advantages = adv.data(), .mask = mask.data(), .entropies = h.data()};
  auto st = policy_gradient_loss(in, PolicyLossConfig{.entropy_coef = 0.5}, grad.data(), dh.data()).value();
  CHECK(st.loss == Approx(-2.0));
  CHECK(st.entropy == Approx(2.0));
  CHECK(dh == std::vector<double>{0, -0.5 / 3, -0.5 / 3, -0.5 / 3});
}

TEST_CASE("policy loss: an entropy bonus without the entropies or their gradient buffer is refused",
          "[rl][losses][entropy]") {
  std::vector<double> x(2, -1.0), mask(2, 1.0), grad(2), dh(2);
  PolicyLossInputs<double> in{.B = 1, .T = 2, .logprobs = x.data(), .old_logprobs = x.data(),
                              .advantages = x.data(), .mask = mask.data()};
  CHECK_THAT(policy_gradient_loss(in, PolicyLossConfig{.entropy_coef = 0.01}, grad.data(), dh.data()).error().message(),
             Catch::Contains("entropies"));
  in.entropies = x.data();
  CHECK_THAT(policy_gradient_loss(in, PolicyLossConfig{.entropy_coef = 0.01}, grad.data()).error().message(),
             Catch::Contains("dentropy"));
  CHECK_THAT(policy_gradient_loss(in, PolicyLossConfig{.entropy_coef = -0.01}, grad.data(), dh.data())
                 .error()
                 .message(),
             Catch::Contains("entropy_coef"));
}


TEST_CASE("value loss: PPO2's clipped loss has its values and its gradient matches finite differences",
          "[rl][losses][value_loss]") {
  for (auto agg : {LossAggregation::token_mean, LossAggregation::sequence_mean,
                   LossAggregation::sequence_sum_over_positions}) {
    for (double clip : {0.0, 0.2}) {
      INFO("aggregation " << static_cast<int>(agg) << " clip " << clip);
      ValueBatch b = random_value_batch(5);
      const ValueLossConfig cfg{.value_clip = clip, .aggregation = agg};
      std::vector<double> grad(b.values.size(), 3.0);
      auto st = value_loss(b.inputs(), cfg, grad.data()).value();
      // The reference, token by token.
      std::vector<double> per_token(b.values.size());
      double clipped = 0;
      for (size_t i = 0; i < per_token.size(); ++i) {
        const double v = b.values[i], R = b.returns[i], old = b.old_values[i];
        const double vc = clip > 0 ? std::min(std::max(v, old - clip), old + clip) : v;
        per_token[i] = 0.5 * std::max((v - R) * (v - R), (vc - R) * (vc - R));
        if (b.mask[i] != 0 && (vc - R) * (vc - R) > (v - R) * (v - R)) clipped += 1;
      }
      CHECK(st.loss == Approx(aggregate(per_token, b.mask, b.B, b.T, agg)).epsilon(1e-12));
      CHECK(st.tokens == 8);
      CHECK(st.clip_fraction == Approx(clipped / 8));
      if (clip > 0) {
        CHECK(st.clip_fraction > 0);  // the batch exercises both branches
        CHECK(st.clip_fraction < 1);
      } else {
        CHECK(st.clip_fraction == 0);
      }
      std::vector<double> scratch(b.values.size());
      const double eps = 1e-7;
      for (size_t i = 0; i < b.values.size(); ++i) {
        const double keep = b.values[i];
        b.values[i] = keep + eps;
        const double up = value_loss(b.inputs(), cfg, scratch.data()).value().loss;
        b.values[i] = keep - eps;
        const double down = value_loss(b.inputs(), cfg, scratch.data()).value().loss;
        b.values[i] = keep;
        CHECK(grad[i] == Approx((up - down) / (2 * eps)).margin(1e-7));
        if (b.mask[i] == 0) CHECK(grad[i] == 0);
      }
    }
  }
}

TEST_CASE("value loss: by hand, the clip holds the value where it moved past old_value +- clip",
          "[rl][losses][value_loss]") {
  // Returns 1. Token 0: v 0.5 moved up from 0 (clip 0.2 -> 0.2): clipped
  // error 0.8 beats 0.5, no gradient. Token 1: v 1.5 moved up from 1.4
  // (inside): error 0.5, gradient 0.5. Token 2: v 2 from 1 (clip -> 1.2):
  // clipped error 0.2 is smaller, the unclipped 1 counts, gradient 1.
  std::vector<double> v = {0.5, 1.5, 2.0}, old = {0.0, 1.4, 1.0}, R = {1, 1, 1}, mask = {1, 1, 1}, grad(3);
  ValueLossInputs<double> in{.B = 1, .T = 3, .values = v.data(), .old_values = old.data(), .returns = R.data(),
                             .mask = mask.data()};
  auto st = value_loss(in, ValueLossConfig{.value_clip = 0.2}, grad.data()).value();
  CHECK(st.loss == Approx(0.5 * (0.64 + 0.25 + 1.0) / 3));
  CHECK(grad[0] == 0);
  CHECK(grad[1] == Approx(0.5 / 3));
  CHECK(grad[2] == Approx(1.0 / 3));
  CHECK(st.clip_fraction == Approx(1.0 / 3));
  CHECK(st.value_mean == Approx(4.0 / 3));
  // Unclipped: old values are not needed.
  in.old_values = nullptr;
  auto plain = value_loss(in, ValueLossConfig{.value_clip = 0}, grad.data()).value();
  CHECK(plain.loss == Approx(0.5 * (0.25 + 0.25 + 1.0) / 3));
  CHECK(grad[0] == Approx(-0.5 / 3));
}

TEST_CASE("value loss: explained variance is 1 - Var(R - v) / Var(R) over the counted tokens",
          "[rl][losses][value_loss]") {
  std::vector<double> R = {1, 2, 3, 4, 100}, mask = {1, 1, 1, 1, 0}, grad(5);
  std::vector<double> perfect = {1, 2, 3, 4, -50}, constant = {7, 7, 7, 7, 7}, half = {1.5, 2, 2.5, 3, 0};
  auto ev = [&](const std::vector<double>& v) {
    ValueLossInputs<double> in{.B = 1, .T = 5, .values = v.data(), .returns = R.data(), .mask = mask.data()};
    return value_loss(in, ValueLossConfig{.value_clip = 0}, grad.data()).value().explained_variance;
  };
  CHECK(ev(perfect) == Approx(1.0));   // the masked-out token's error does not count
  CHECK(ev(constant) == Approx(0.0));  // a constant is no better than the mean
  // R - v = -0.5, 0, 0.5, 1: variance 0.3125 against the returns' 1.25.
  CHECK(ev(half) == Approx(1.0 - 0.3125 / 1.25));
  std::vector<double> flat(5, 2.0);
  ValueLossInputs<double> in{.B = 1, .T = 5, .values = half.data(), .returns = flat.data(), .mask = mask.data()};
  CHECK(value_loss(in, ValueLossConfig{.value_clip = 0}, grad.data()).value().explained_variance == 0);
}

TEST_CASE("value loss: bad settings and missing inputs are refused", "[rl][losses][value_loss]") {
  std::vector<double> x(2, 0.5), mask(2, 1.0), grad(2);
  ValueLossInputs<double> in{.B = 1, .T = 2, .values = x.data(), .returns = x.data(), .mask = mask.data()};
  CHECK_THAT(value_loss(in, ValueLossConfig{.value_clip = 0.2}, grad.data()).error().message(),
             Catch::Contains("old_values"));
  CHECK_THAT(value_loss(in, ValueLossConfig{.value_clip = -1}, grad.data()).error().message(),
             Catch::Contains("value_clip"));
  in.returns = nullptr;
  CHECK(value_loss(in, ValueLossConfig{.value_clip = 0}, grad.data()).error().code() ==
        troupe::ErrorCode::invalid_argument);
}
