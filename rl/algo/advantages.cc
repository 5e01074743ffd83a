#include "algo/advantages.h"

#include <cmath>
#include <string>
#include <vector>

#include "algo/gae.h"

namespace troupe::rl::algo {
namespace {

// ok when `count` rewards split into groups of `group_size`, at least `min_size`.
Status check_groups(const char* what, size_t count, size_t group_size, size_t min_size) {
  if (group_size < min_size || group_size == 0 || count % group_size != 0) {
    return Status(ErrorCode::invalid_argument, std::string(what) + ": " + std::to_string(count) +
                                                   " rewards do not split into groups of " +
                                                   std::to_string(group_size) + " (groups of at least " +
                                                   std::to_string(min_size) + ")");
  }
  return {};
}

}  // namespace

Result<std::vector<double>> group_advantages(std::span<const double> rewards, size_t group_size,
                                             const GroupAdvantageConfig& config) {
  if (Status s = check_groups("group advantages", rewards.size(), group_size, 1); !s.ok()) return error(s);
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

Result<std::vector<double>> rloo_advantages(std::span<const double> rewards, size_t group_size) {
  if (Status s = check_groups("rloo advantages", rewards.size(), group_size, 2); !s.ok()) return error(s);
  std::vector<double> out(rewards.size());
  const double others = static_cast<double>(group_size - 1);
  for (size_t g = 0; g < rewards.size(); g += group_size) {
    double sum = 0;
    for (size_t i = 0; i < group_size; ++i) sum += rewards[g + i];
    for (size_t i = 0; i < group_size; ++i) out[g + i] = rewards[g + i] - (sum - rewards[g + i]) / others;
  }
  return out;
}

template <typename F>
Status reinforce_pp_advantages(const F* rewards, const F* mask, size_t B, size_t T, double gamma, F* advantages) {
  // The rewards-to-go are GAE's returns with no critic (values 0) and
  // lambda 1; the returns buffer is the only scratch.
  std::vector<F> returns(B * T);
  const GaeConfig config{.gamma = gamma, .lambda = 1.0, .whiten_advantages = false};
  if (Status s = gae<F>(rewards, nullptr, mask, B, T, config, advantages, returns.data()); !s.ok()) {
    return Status(s.code(), "reinforce++ advantages: " + s.message());
  }
  return masked_whiten(advantages, mask, B * T);
}

template Status reinforce_pp_advantages<float>(const float*, const float*, size_t, size_t, double, float*);
template Status reinforce_pp_advantages<double>(const double*, const double*, size_t, size_t, double, double*);

}  // namespace troupe::rl::algo
