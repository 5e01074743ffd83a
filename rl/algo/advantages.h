// Advantages from rewards for critic-free RL: GRPO's group-normalised
// advantage (each prompt is sampled `group_size` times; a sample's
// advantage is its reward against its group's mean, optionally divided by
// the group's standard deviation).
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

}  // namespace troupe::rl::algo
