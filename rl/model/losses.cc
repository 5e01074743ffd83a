#include "model/losses.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace troupe::rl::model {

Result<LossAggregation> parse_loss_aggregation(std::string_view name) {
  if (name == "token_mean") return LossAggregation::token_mean;
  if (name == "sequence_mean") return LossAggregation::sequence_mean;
  if (name == "sequence_sum_over_positions") return LossAggregation::sequence_sum_over_positions;
  return error(ErrorCode::invalid_argument, "loss aggregation \"" + std::string(name) +
                                                "\" is unknown; use token_mean, sequence_mean or "
                                                "sequence_sum_over_positions");
}

Result<KlEstimator> parse_kl_estimator(std::string_view name) {
  if (name == "k1") return KlEstimator::k1;
  if (name == "k3") return KlEstimator::k3;
  return error(ErrorCode::invalid_argument, "kl estimator \"" + std::string(name) + "\" is unknown; use k1 or k3");
}

Status PolicyLossConfig::validate() const {
  auto bad = [](const std::string& what) { return Status(ErrorCode::invalid_argument, "policy loss: " + what); };
  if (!(clip_low >= 0.0 && clip_low < 1.0)) return bad("clip_low " + std::to_string(clip_low) + " must be in [0, 1)");
  if (!(clip_high >= 0.0) || !std::isfinite(clip_high)) {
    return bad("clip_high " + std::to_string(clip_high) + " must be 0 or more");
  }
  if (!(kl_coef >= 0.0) || !std::isfinite(kl_coef)) return bad("kl_coef " + std::to_string(kl_coef) + " must be 0 or more");
  if (!(entropy_coef >= 0.0) || !std::isfinite(entropy_coef)) {
    return bad("entropy_coef " + std::to_string(entropy_coef) + " must be 0 or more");
  }
  return {};
}

Status ValueLossConfig::validate() const {
  if (!(value_clip >= 0.0) || !std::isfinite(value_clip)) {
    return Status(ErrorCode::invalid_argument,
                  "value loss: value_clip " + std::to_string(value_clip) + " must be 0 (unclipped) or more");
  }
  return {};
}

namespace {

// The weight of each token in the aggregate (sum of weight * per-token
// loss), by the aggregation; zero off the mask.
template <typename F>
void aggregation_weights(std::vector<double>& w, const F* mask, size_t B, size_t T, LossAggregation agg) {
  w.assign(B * T, 0.0);
  double total = 0;
  size_t sequences = 0;
  for (size_t b = 0; b < B; ++b) {
    double count = 0;
    for (size_t t = 0; t < T; ++t) count += static_cast<double>(mask[b * T + t]);
    total += count;
    if (count > 0) ++sequences;
  }
  for (size_t b = 0; b < B; ++b) {
    double count = 0;
    for (size_t t = 0; t < T; ++t) count += static_cast<double>(mask[b * T + t]);
    for (size_t t = 0; t < T; ++t) {
      const double m = static_cast<double>(mask[b * T + t]);
      if (m == 0) continue;
      switch (agg) {
        case LossAggregation::token_mean:
          w[b * T + t] = m / total;
          break;
        case LossAggregation::sequence_mean:
          w[b * T + t] = m / (count * static_cast<double>(sequences));
          break;
        case LossAggregation::sequence_sum_over_positions:
          w[b * T + t] = m / (static_cast<double>(T) * static_cast<double>(B));
          break;
      }
    }
  }
}

}  // namespace

template <typename F>
Result<PolicyLossStats> policy_gradient_loss(const PolicyLossInputs<F>& in, const PolicyLossConfig& config,
                                             F* dlogprobs, F* dentropy) {
  if (Status s = config.validate(); !s.ok()) return error(s);
  if (in.logprobs == nullptr || in.old_logprobs == nullptr || in.advantages == nullptr || in.mask == nullptr ||
      dlogprobs == nullptr) {
    return error(ErrorCode::invalid_argument,
                 "policy loss: logprobs, old_logprobs, advantages, mask and the gradient buffer are all required");
  }
  if (config.kl_coef > 0 && in.ref_logprobs == nullptr) {
    return error(ErrorCode::invalid_argument,
                 "policy loss: kl_coef > 0 needs the reference policy's logprobs (ref_logprobs)");
  }
  if (config.entropy_coef > 0 && (in.entropies == nullptr || dentropy == nullptr)) {
    return error(ErrorCode::invalid_argument,
                 "policy loss: entropy_coef > 0 needs the entropies (Gpt::entropies()) and a dentropy buffer");
  }
  const size_t n = in.B * in.T;
  std::vector<double> w;
  aggregation_weights(w, in.mask, in.B, in.T, config.aggregation);
  PolicyLossStats st;
  double clipped = 0, ratio_sum = 0, entropy_sum = 0, entropy_term = 0;
  for (size_t i = 0; i < n; ++i) {
    dlogprobs[i] = F(0);
    if (dentropy != nullptr) dentropy[i] = F(0);
    if (in.mask[i] == F(0)) continue;
    if (in.entropies != nullptr) {
      const double H = static_cast<double>(in.entropies[i]);
      entropy_sum += H;
      entropy_term += w[i] * H;
      if (dentropy != nullptr) dentropy[i] = static_cast<F>(-config.entropy_coef * w[i]);
    }
    const double lp = static_cast<double>(in.logprobs[i]);
    const double A = static_cast<double>(in.advantages[i]);
    const double r = std::exp(lp - static_cast<double>(in.old_logprobs[i]));
    const double unclipped = -A * r;
    const double clipped_term = -A * std::clamp(r, 1.0 - config.clip_low, 1.0 + config.clip_high);
    // max(): the pessimistic bound. Where the clipped term wins, the ratio
    // is held at the clip and the token's gradient is zero.
    double pg, dpg;
    if (unclipped >= clipped_term) {
      pg = unclipped;
      dpg = -A * r;
    } else {
      pg = clipped_term;
      dpg = 0;
      clipped += 1;
    }
    double kl = 0, dkl = 0;
    if (in.ref_logprobs != nullptr) {
      const double delta = static_cast<double>(in.ref_logprobs[i]) - lp;  // log ref - log pi
      if (config.kl_estimator == KlEstimator::k1) {
        kl = -delta;
        dkl = 1;
      } else {
        kl = std::exp(delta) - delta - 1;
        dkl = 1 - std::exp(delta);
      }
    }
    st.policy_loss += w[i] * pg;
    st.kl += w[i] * kl;
    st.tokens += 1;
    ratio_sum += r;
    dlogprobs[i] = static_cast<F>(w[i] * (dpg + config.kl_coef * dkl));
  }
  st.loss = st.policy_loss + config.kl_coef * st.kl - config.entropy_coef * entropy_term;
  if (st.tokens > 0) {
    st.clip_fraction = clipped / st.tokens;
    st.ratio_mean = ratio_sum / st.tokens;
    st.entropy = entropy_sum / st.tokens;
  }
  return st;
}

template <typename F>
Result<ValueLossStats> value_loss(const ValueLossInputs<F>& in, const ValueLossConfig& config, F* dvalues) {
  if (Status s = config.validate(); !s.ok()) return error(s);
  if (in.values == nullptr || in.returns == nullptr || in.mask == nullptr || dvalues == nullptr ||
      (config.value_clip > 0 && in.old_values == nullptr)) {
    return error(ErrorCode::invalid_argument,
                 "value loss: values, returns, mask and the gradient buffer are required, and old_values with "
                 "value_clip > 0");
  }
  const size_t n = in.B * in.T;
  std::vector<double> w;
  aggregation_weights(w, in.mask, in.B, in.T, config.aggregation);
  ValueLossStats st;
  double clipped = 0, value_sum = 0, return_sum = 0;
  for (size_t i = 0; i < n; ++i) {
    dvalues[i] = F(0);
    if (in.mask[i] == F(0)) continue;
    const double v = static_cast<double>(in.values[i]), R = static_cast<double>(in.returns[i]);
    double err = v - R, grad = v - R;
    if (config.value_clip > 0) {
      const double old = static_cast<double>(in.old_values[i]);
      const double clipped_err = std::clamp(v, old - config.value_clip, old + config.value_clip) - R;
      // max(): where the clipped error is the larger, v sits outside the
      // clip range (inside it the two are equal) and the loss holds still.
      if (clipped_err * clipped_err > err * err) {
        err = clipped_err;
        grad = 0;
        clipped += 1;
      }
    }
    st.loss += w[i] * 0.5 * err * err;
    dvalues[i] = static_cast<F>(w[i] * grad);
    st.tokens += 1;
    value_sum += v;
    return_sum += R;
  }
  if (st.tokens == 0) return st;
  st.clip_fraction = clipped / st.tokens;
  st.value_mean = value_sum / st.tokens;
  // Explained variance, over the counted tokens: how much of the returns'
  // spread the critic accounts for (1 perfect, 0 no better than their
  // mean, negative worse).
  const double return_mean = return_sum / st.tokens;
  double residual_mean = 0;
  for (size_t i = 0; i < n; ++i) {
    if (in.mask[i] != F(0)) residual_mean += static_cast<double>(in.returns[i]) - static_cast<double>(in.values[i]);
  }
  residual_mean /= st.tokens;
  double var_returns = 0, var_residual = 0;
  for (size_t i = 0; i < n; ++i) {
    if (in.mask[i] == F(0)) continue;
    const double R = static_cast<double>(in.returns[i]);
    const double residual = R - static_cast<double>(in.values[i]);
    var_returns += (R - return_mean) * (R - return_mean);
    var_residual += (residual - residual_mean) * (residual - residual_mean);
  }
  if (var_returns > 0) st.explained_variance = 1.0 - var_residual / var_returns;
  return st;
}

template <typename F>
F masked_nll_loss(const F* logprobs, const F* mask, size_t n, F* dlogprobs) {
  double count = 0;
  for (size_t i = 0; i < n; ++i) count += static_cast<double>(mask[i]);
  double loss = 0;
  for (size_t i = 0; i < n; ++i) {
    const double w = count > 0 ? static_cast<double>(mask[i]) / count : 0.0;
    loss -= w * static_cast<double>(logprobs[i]);
    dlogprobs[i] = static_cast<F>(-w);
  }
  return static_cast<F>(loss);
}

template <typename F>
void broadcast_advantages(F* advantages, const F* per_sequence, size_t B, size_t T) {
  for (size_t b = 0; b < B; ++b) std::fill(advantages + b * T, advantages + (b + 1) * T, per_sequence[b]);
}

template <typename F>
void to_model_dlosses(F* dlosses, const F* dlogprobs, size_t n) {
  for (size_t i = 0; i < n; ++i) dlosses[i] = -dlogprobs[i];
}

#define TROUPE_RL_LOSSES(F)                                                                                   \
  template Result<PolicyLossStats> policy_gradient_loss<F>(const PolicyLossInputs<F>&, const PolicyLossConfig&, \
                                                           F*, F*);                                            \
  template Result<ValueLossStats> value_loss<F>(const ValueLossInputs<F>&, const ValueLossConfig&, F*);        \
  template F masked_nll_loss<F>(const F*, const F*, size_t, F*);                                              \
  template void broadcast_advantages<F>(F*, const F*, size_t, size_t);                                        \
  template void to_model_dlosses<F>(F*, const F*, size_t);
TROUPE_RL_LOSSES(float)
TROUPE_RL_LOSSES(double)
#undef TROUPE_RL_LOSSES

}  // namespace troupe::rl::model
