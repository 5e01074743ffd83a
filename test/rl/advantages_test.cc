// The critic-free advantage estimators of rl/algo/advantages.h beside
// GRPO's (tested with the task in arithmetic_test.cc): RLOO's leave-one-out
// baseline and REINFORCE++'s batch-normalised rewards-to-go, against values
// computed by hand.
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "algo/advantages.h"

using namespace troupe::rl::algo;

TEST_CASE("rloo: each sample's reward against the mean of the rest of its group", "[rl][advantages]") {
  // Group 0: 1, 0, 0, 1 -> 1 - 1/3, 0 - 2/3, 0 - 2/3, 1 - 1/3. Group 1: all
  // equal -> zero. Group 2: 3, 0, 1, 2 -> 3 - 1, 0 - 2, 1 - 5/3, 2 - 4/3.
  const std::vector<double> rewards = {1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5, 3, 0, 1, 2};
  auto adv = rloo_advantages(rewards, 4);
  REQUIRE(adv.has_value());
  const std::vector<double> expect = {2.0 / 3, -2.0 / 3, -2.0 / 3, 2.0 / 3, 0, 0, 0, 0, 2, -2, -2.0 / 3, 2.0 / 3};
  REQUIRE(adv->size() == expect.size());
  for (size_t i = 0; i < expect.size(); ++i) {
    INFO("sample " << i);
    CHECK((*adv)[i] == Approx(expect[i]).margin(1e-12));
  }
  // RLOO is the group-centred reward scaled by k / (k - 1).
  auto centred = group_advantages(rewards, 4, GroupAdvantageConfig{.scale_by_std = false}).value();
  for (size_t i = 0; i < expect.size(); ++i) CHECK((*adv)[i] == Approx(centred[i] * 4.0 / 3.0).margin(1e-12));
  // Two samples: each against the other.
  auto pair = rloo_advantages(std::vector<double>{5, 2}, 2).value();
  CHECK(pair == std::vector<double>{3, -3});
}

TEST_CASE("rloo: a group of one (no others to compare with) or a count the size does not divide is refused",
          "[rl][advantages]") {
  const std::vector<double> rewards = {1, 0, 1};
  CHECK_THAT(rloo_advantages(rewards, 1).error().message(), Catch::Contains("at least 2"));
  CHECK_THAT(rloo_advantages(rewards, 2).error().message(), Catch::Contains("groups of 2"));
  CHECK(rloo_advantages(rewards, 0).error().code() == troupe::ErrorCode::invalid_argument);
}

TEST_CASE("reinforce++: the rewards-to-go, normalised over every completion token of the batch", "[rl][advantages]") {
  // Row 0: a prompt token, then three completion tokens with a KL penalty
  // of 0.1 each and the outcome 1 on the last: rewards-to-go 0.7, 0.8, 0.9.
  // Row 1: two prompt tokens, then two tokens with penalty 0.2 and outcome
  // 0: -0.4, -0.2. Over the five: mean 0.36, unbiased variance
  // (0.34^2 + 0.44^2 + 0.54^2 + 0.76^2 + 0.56^2) / 4 = 1.492 / 4 = 0.373.
  const std::vector<double> rewards = {0, -0.1, -0.1, 0.9, 0, 0, -0.2, -0.2};
  const std::vector<double> mask = {0, 1, 1, 1, 0, 0, 1, 1};
  std::vector<double> adv(8, 5.0);
  REQUIRE(reinforce_pp_advantages(rewards.data(), mask.data(), 2, 4, 1.0, adv.data()).ok());
  const double rstd = 1.0 / std::sqrt(0.373 + 1e-8);
  const std::vector<double> to_go = {0, 0.7, 0.8, 0.9, 0, 0, -0.4, -0.2};
  for (size_t i = 0; i < 8; ++i) {
    INFO("token " << i);
    CHECK(adv[i] == Approx(mask[i] != 0 ? (to_go[i] - 0.36) * rstd : 0.0).margin(1e-12));
  }
  // gamma 0.5 discounts the later rewards: row 0 to go 0.9, -0.1 + 0.45 =
  // 0.35, -0.1 + 0.175 = 0.075; row 1: -0.2, -0.2 - 0.1 = -0.3. Mean 0.165;
  // squared deviations 0.0081 + 0.034225 + 0.540225 + 0.216225 + 0.133225 = 0.932.
  REQUIRE(reinforce_pp_advantages(rewards.data(), mask.data(), 2, 4, 0.5, adv.data()).ok());
  const double rstd_half = 1.0 / std::sqrt(0.932 / 4 + 1e-8);
  CHECK(adv[1] == Approx((0.075 - 0.165) * rstd_half).margin(1e-12));
  CHECK(adv[3] == Approx((0.9 - 0.165) * rstd_half).margin(1e-12));
  CHECK(adv[6] == Approx((-0.3 - 0.165) * rstd_half).margin(1e-12));
}

TEST_CASE("reinforce++: bad settings are refused", "[rl][advantages]") {
  const std::vector<float> rewards = {1, 0, 1}, one = {0, 1, 0}, all = {1, 1, 1};
  std::vector<float> adv(3);
  CHECK_THAT(reinforce_pp_advantages(rewards.data(), all.data(), 1, 3, 1.5, adv.data()).message(),
             Catch::Contains("gamma"));
  CHECK_THAT(reinforce_pp_advantages(rewards.data(), one.data(), 1, 3, 1.0, adv.data()).message(),
             Catch::Contains("at least 2"));
}
