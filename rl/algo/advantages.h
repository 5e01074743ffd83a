// Advantages from rewards for critic-free RL: GRPO's group-normalised
// advantage (each prompt is sampled `group_size` times; a sample's
// advantage is its reward against its group's mean, optionally divided by
// the group's standard deviation), RLOO's leave-one-out baseline, and
// REINFORCE++'s batch-normalised return (for PPO with a critic: gae.h).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "troupe/status.h"

namespace troupe::rl::algo {

/// How a group's rewards become advantages.
struct GroupAdvantageConfig {
  /// Divide by the group's standard deviation (GRPO); false leaves the
  /// centred rewards (Dr. GRPO: no difficulty bias).
  bool scale_by_std = true;
  /// Added to the standard deviation before dividing.
  double eps = 1e-6;
};

/// The advantages of `rewards`, laid out group by group (group g is
/// rewards[g * group_size .. (g+1) * group_size)). A group whose rewards
/// are all equal gets zero advantages (it teaches nothing). Errors: a
/// group size of 0, or a reward count it does not divide.
Result<std::vector<double>> group_advantages(std::span<const double> rewards, size_t group_size,
                                             const GroupAdvantageConfig& config = {});

/// RLOO (Ahmadian et al. 2024): a sample's advantage is its reward minus
/// the mean of the other group_size - 1 rewards of its group (laid out as
/// group_advantages'), an unbiased baseline that does not see the sample
/// itself. Errors: a group size below 2, or a reward count it does not
/// divide.
Result<std::vector<double>> rloo_advantages(std::span<const double> rewards, size_t group_size);

/// REINFORCE++ (Hu 2025): per token, the discounted sum of the rewards
/// from that token to the end of its completion, normalised over the whole
/// batch (algo::masked_whiten over every masked token) instead of per
/// group. `rewards` (B*T) are per token with the KL penalty already folded
/// in by the caller (the sequence's reward on its last token, minus
/// kl_coef * kl on every token); `advantages` (B*T) is written, 0 off the
/// mask. Errors: gamma outside [0, 1], fewer than 2 masked tokens.
template <typename F>
Status reinforce_pp_advantages(const F* rewards, const F* mask, size_t B, size_t T, double gamma, F* advantages);

}  // namespace troupe::rl::algo
