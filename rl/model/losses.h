// The losses RL post-training takes gradients of, as functions of the
// policy's per-token log-probabilities (and, for PPO, entropies and
// values): each returns the loss and writes d loss / d logprob per token,
// which the model's backward takes (the model's per-token loss is
// -logprob, so dlosses = -dlogprobs: to_model_dlosses()), and d loss /
// d entropy and d loss / d value, which it takes as they are.
//
// Shapes: B sequences of T positions, row-major (b * T + t); `mask` is 1 on
// the tokens that count (the answer) and 0 elsewhere (prompt, padding).
// Templates on the scalar type: float for training, double for the tests'
// finite-difference checks.
#pragma once

#include <cstddef>
#include <string_view>

#include "troupe/status.h"

namespace troupe::rl::model {

/// How per-token losses become one number.
enum class LossAggregation : uint8_t {
  /// Mean over every counted token of the batch (DAPO's token-level loss:
  /// a long answer weighs more).
  token_mean,
  /// Mean over sequences of each sequence's mean over its tokens (GRPO's
  /// original form).
  sequence_mean,
  /// Mean over sequences of each sequence's sum over its tokens, divided by
  /// T (Dr. GRPO: no length bias).
  sequence_sum_over_positions,
};

/// The estimator of KL(policy || reference) per token, from the two
/// log-probabilities (Schulman's k1 and k3).
enum class KlEstimator : uint8_t {
  /// log pi - log ref: unbiased, can be negative.
  k1,
  /// exp(ref - pi) - (ref - pi) - 1: unbiased, never negative, lower variance.
  k3,
};

/// Parses "token_mean" / "sequence_mean" / "sequence_sum_over_positions",
/// and "k1" / "k3" (for configs).
Result<LossAggregation> parse_loss_aggregation(std::string_view name);
Result<KlEstimator> parse_kl_estimator(std::string_view name);

/// The policy-gradient loss's settings.
struct PolicyLossConfig {
  /// PPO's clipping of the importance ratio to [1 - clip_low, 1 + clip_high]
  /// (a higher clip_high is DAPO's clip-higher).
  double clip_low = 0.2;
  double clip_high = 0.2;
  /// Weight of the KL penalty to the reference policy (0: none, and no
  /// reference log-probabilities are needed).
  double kl_coef = 0.0;
  KlEstimator kl_estimator = KlEstimator::k3;
  LossAggregation aggregation = LossAggregation::token_mean;
  /// Weight of the entropy bonus: the loss takes away entropy_coef times
  /// the entropy of the policy's next-token distribution, aggregated as the
  /// policy term is (0: none, and no entropies are needed).
  double entropy_coef = 0.0;

  /// ok, or which field is out of range.
  Status validate() const;
};

/// What a policy-gradient loss computed, for logs.
struct PolicyLossStats {
  double loss = 0;           // the aggregated total (policy term + kl_coef * kl - entropy_coef * entropy term)
  double policy_loss = 0;    // the aggregated clipped surrogate
  double kl = 0;             // the aggregated KL estimate
  double clip_fraction = 0;  // share of counted tokens whose gradient was clipped away
  double ratio_mean = 0;     // mean importance ratio over counted tokens
  double tokens = 0;         // counted tokens
  double entropy = 0;        // mean entropy over counted tokens (0 when no entropies were given)
};

/// The inputs of the policy-gradient loss, each B*T.
template <typename F>
struct PolicyLossInputs {
  size_t B = 0, T = 0;
  const F* logprobs = nullptr;      // the policy being trained
  const F* old_logprobs = nullptr;  // the policy that sampled (importance ratio)
  const F* ref_logprobs = nullptr;  // the reference (needed when kl_coef > 0)
  const F* advantages = nullptr;    // per token (a sequence's advantage repeated: broadcast_advantages)
  const F* mask = nullptr;
  /// The policy's next-token entropy per position (Gpt::entropies();
  /// needed when entropy_coef > 0, reported in the stats whenever given).
  const F* entropies = nullptr;
};

/// PPO's clipped surrogate with an optional KL penalty and entropy bonus,
/// aggregated: per token, with r = exp(logprob - old_logprob), A the
/// advantage and H the entropy,
///   loss_t = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) + kl_coef * kl_t
///            - entropy_coef * H_t.
/// Writes d loss / d logprobs (B*T; zero where the mask is) and, when
/// `dentropy` is given, d loss / d H (B*T: what Gpt::backward takes as
/// dentropy). Errors: a bad config, a missing input, ref_logprobs missing
/// with kl_coef > 0, entropies or dentropy missing with entropy_coef > 0.
template <typename F>
Result<PolicyLossStats> policy_gradient_loss(const PolicyLossInputs<F>& in, const PolicyLossConfig& config,
                                             F* dlogprobs, F* dentropy = nullptr);

/// The value loss's settings.
struct ValueLossConfig {
  /// PPO2's value clipping: the new value is also taken clipped to
  /// old_value +- value_clip and the worse of the two errors counts, so the
  /// critic moves little per update (0: unclipped).
  double value_clip = 0.2;
  LossAggregation aggregation = LossAggregation::token_mean;

  /// ok, or which field is out of range.
  Status validate() const;
};

/// What a value loss computed, for logs.
struct ValueLossStats {
  double loss = 0;           // the aggregated value loss
  double clip_fraction = 0;  // share of counted tokens whose clipped error won (no gradient)
  double explained_variance =
      0;                  // 1 - Var(returns - values) / Var(returns) over counted tokens (0 if Var(returns) is 0)
  double value_mean = 0;  // mean value over counted tokens
  double tokens = 0;      // counted tokens
};

/// The inputs of the value loss, each B*T.
template <typename F>
struct ValueLossInputs {
  size_t B = 0, T = 0;
  const F* values = nullptr;      // the critic being trained (Gpt::values())
  const F* old_values = nullptr;  // the critic at rollout time (needed when value_clip > 0)
  const F* returns = nullptr;     // the targets (GAE's returns)
  const F* mask = nullptr;
};

/// PPO's clipped value loss, aggregated: per token, with v the value, R the
/// return and v_c = clip(v, old_value - value_clip, old_value + value_clip),
///   loss_t = 0.5 * max((v - R)^2, (v_c - R)^2)       (0.5 * (v - R)^2 unclipped).
/// Writes d loss / d values (B*T; zero where the mask is: what Gpt::backward
/// takes as dvalues, scaled by the caller's value coefficient). Errors: a
/// bad config, a missing input.
template <typename F>
Result<ValueLossStats> value_loss(const ValueLossInputs<F>& in, const ValueLossConfig& config, F* dvalues);

/// The supervised next-token loss: the token-mean of -logprob over the
/// masked tokens. Writes d loss / d logprobs (n). Returns 0 (and zero
/// gradients) when nothing is masked in.
template <typename F>
F masked_nll_loss(const F* logprobs, const F* mask, size_t n, F* dlogprobs);

/// advantages[b*T + t] = per_sequence[b] for every t.
template <typename F>
void broadcast_advantages(F* advantages, const F* per_sequence, size_t B, size_t T);

/// The model's backward takes d loss / d (per-token loss), and its loss is
/// -logprob: dlosses[i] = -dlogprobs[i].
template <typename F>
void to_model_dlosses(F* dlosses, const F* dlogprobs, size_t n);

}  // namespace troupe::rl::model
