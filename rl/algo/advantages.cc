#include "algo/advantages.h"

#include <cmath>
#include <string>

namespace troupe::rl::algo {

Result<std::vector<double>> group_advantages(std::span<const double> rewards, size_t group_size,
                                             const GroupAdvantageConfig& config) {
  if (group_size == 0 || rewards.size() % group_size != 0) {
    return error(ErrorCode::invalid_argument, "group advantages: " + std::to_string(rewards.size()) +
                                                  " rewards do not split into groups of " +
                                                  std::to_string(group_size));
  }
  std::vector<double> out(rewards.size());
  for (size_t g = 0; g < rewards.size(); g += group_size) {
    double mean = 0;
    for (size_t i = 0; i < group_size; ++i) mean += rewards[g + i];
    mean /= static_cast<double>(group_size);
    double var = 0;
    for (size_t i = 0; i < group_size; ++i) var += (rewards[g + i] - mean) * (rewards[g + i] - mean);
    // The sample standard deviation (n - 1), as GRPO's implementations take it.
    const double std_dev = group_size > 1 ? std::sqrt(var / static_cast<double>(group_size - 1)) : 0.0;
    for (size_t i = 0; i < group_size; ++i) {
      const double centred = rewards[g + i] - mean;
      out[g + i] = config.scale_by_std ? centred / (std_dev + config.eps) : centred;
    }
  }
  return out;
}

}  // namespace troupe::rl::algo
