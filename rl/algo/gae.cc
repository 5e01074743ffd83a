#include "algo/gae.h"

#include <cmath>
#include <string>

namespace troupe::rl::algo {

Status GaeConfig::validate() const {
  auto in_unit = [](double x) { return x >= 0.0 && x <= 1.0; };
  if (!in_unit(gamma) || !in_unit(lambda)) {
    return Status(ErrorCode::invalid_argument, "gae: gamma " + std::to_string(gamma) + " and lambda " +
                                                   std::to_string(lambda) + " must both be in [0, 1]");
  }
  return {};
}

template <typename F>
Status gae(const F* rewards, const F* values, const F* mask, size_t B, size_t T, const GaeConfig& config, F* advantages,
           F* returns) {
  if (Status s = config.validate(); !s.ok()) return s;
  if (rewards == nullptr || mask == nullptr || advantages == nullptr || returns == nullptr) {
    return Status(ErrorCode::invalid_argument, "gae: rewards, mask, advantages and returns are required");
  }
  const double gamma = config.gamma, trace = config.gamma * config.lambda;
  for (size_t b = 0; b < B; ++b) {
    // Backwards from the end of the row: the step after the last one is
    // terminal (value 0, advantage 0).
    double next_value = 0, next_advantage = 0;
    for (size_t t = T; t-- > 0;) {
      const size_t i = b * T + t;
      if (mask[i] == F(0)) {
        advantages[i] = F(0);
        returns[i] = F(0);
        continue;
      }
      const double value = values != nullptr ? static_cast<double>(values[i]) : 0.0;
      const double delta = static_cast<double>(rewards[i]) + gamma * next_value - value;
      next_advantage = delta + trace * next_advantage;
      next_value = value;
      advantages[i] = static_cast<F>(next_advantage);
      returns[i] = static_cast<F>(next_advantage + value);
    }
  }
  return config.whiten_advantages ? masked_whiten(advantages, mask, B * T) : Status{};
}

template <typename F>
Status masked_whiten(F* x, const F* mask, size_t n) {
  double count = 0, sum = 0;
  for (size_t i = 0; i < n; ++i) {
    if (mask[i] == F(0)) continue;
    count += 1;
    sum += static_cast<double>(x[i]);
  }
  if (count < 2) {
    return Status(ErrorCode::invalid_argument, "masked whiten: " + std::to_string(static_cast<size_t>(count)) +
                                                   " masked values; the variance needs at least 2");
  }
  const double mean = sum / count;
  double squares = 0;
  for (size_t i = 0; i < n; ++i) {
    if (mask[i] != F(0)) squares += (static_cast<double>(x[i]) - mean) * (static_cast<double>(x[i]) - mean);
  }
  // The 1e-8 keeps a batch of equal values at 0 instead of 0 / 0.
  const double rstd = 1.0 / std::sqrt(squares / (count - 1) + 1e-8);
  for (size_t i = 0; i < n; ++i) {
    x[i] = mask[i] == F(0) ? F(0) : static_cast<F>((static_cast<double>(x[i]) - mean) * rstd);
  }
  return {};
}

#define TROUPE_RL_GAE(F)                                                                          \
  template Status gae<F>(const F*, const F*, const F*, size_t, size_t, const GaeConfig&, F*, F*); \
  template Status masked_whiten<F>(F*, const F*, size_t);
TROUPE_RL_GAE(float)
TROUPE_RL_GAE(double)
#undef TROUPE_RL_GAE

}  // namespace troupe::rl::algo
