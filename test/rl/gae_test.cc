// GAE (rl/algo/gae.h) against a straightforward reference (each
// advantage as the sum over the rest of its completion of (gamma lambda)^k
// times the TD error k steps on), over sequences of different lengths in
// one padded batch; its two limits (lambda = 1: the Monte Carlo return
// minus the value; lambda = 0: the TD error); whitening; bad settings.
#include <cmath>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "algo/gae.h"

using namespace troupe::rl::algo;

namespace {

/// B = 3 rows of T = 8: a prompt (masked out) then completions of 5, 2 and
/// 6 tokens, padding after them.
struct Rollout {
  size_t B = 3, T = 8;
  std::vector<double> rewards, values, mask;
};

Rollout random_rollout(uint64_t seed) {
  Rollout r;
  r.mask = {0, 0, 1, 1, 1, 1, 1, 0,  //
            0, 0, 0, 0, 1, 1, 0, 0,  //
            0, 1, 1, 1, 1, 1, 1, 0};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (size_t i = 0; i < r.B * r.T; ++i) {
    r.rewards.push_back(u(rng));
    r.values.push_back(u(rng));
  }
  return r;
}

/// The completion's positions of row b, in order.
std::vector<size_t> steps_of(const Rollout& r, size_t b) {
  std::vector<size_t> out;
  for (size_t t = 0; t < r.T; ++t) {
    if (r.mask[b * r.T + t] != 0) out.push_back(b * r.T + t);
  }
  return out;
}

/// A_t = sum_k (gamma lambda)^k delta_{t+k}, delta_t = r_t + gamma V_{t+1} - V_t
/// (V past the last step 0), by the definition: a double loop.
std::vector<double> reference_advantages(const Rollout& r, double gamma, double lambda) {
  std::vector<double> adv(r.B * r.T, 0.0);
  for (size_t b = 0; b < r.B; ++b) {
    const std::vector<size_t> s = steps_of(r, b);
    for (size_t t = 0; t < s.size(); ++t) {
      double sum = 0;
      for (size_t k = t; k < s.size(); ++k) {
        const double next_value = k + 1 < s.size() ? r.values[s[k + 1]] : 0.0;
        const double delta = r.rewards[s[k]] + gamma * next_value - r.values[s[k]];
        sum += std::pow(gamma * lambda, static_cast<double>(k - t)) * delta;
      }
      adv[s[t]] = sum;
    }
  }
  return adv;
}

}  // namespace

TEST_CASE("gae: advantages and returns match the definition over completions of different lengths", "[rl][gae]") {
  Rollout r = random_rollout(1);
  for (double gamma : {1.0, 0.9}) {
    for (double lambda : {0.95, 0.5}) {
      INFO("gamma " << gamma << " lambda " << lambda);
      std::vector<double> adv(r.B * r.T, 7.0), ret(r.B * r.T, 7.0);
      REQUIRE(gae(r.rewards.data(), r.values.data(), r.mask.data(), r.B, r.T,
                  GaeConfig{.gamma = gamma, .lambda = lambda}, adv.data(), ret.data())
                  .ok());
      const std::vector<double> expect = reference_advantages(r, gamma, lambda);
      for (size_t i = 0; i < adv.size(); ++i) {
        INFO("position " << i);
        CHECK(adv[i] == Approx(expect[i]).margin(1e-12));
        CHECK(ret[i] == Approx(r.mask[i] != 0 ? expect[i] + r.values[i] : 0.0).margin(1e-12));
      }
    }
  }
}

TEST_CASE("gae: lambda 1 is the Monte Carlo return minus the value, lambda 0 the TD error", "[rl][gae]") {
  Rollout r = random_rollout(2);
  const double gamma = 0.8;
  std::vector<double> adv1(r.B * r.T), ret1(r.B * r.T), adv0(r.B * r.T), ret0(r.B * r.T);
  REQUIRE(gae(r.rewards.data(), r.values.data(), r.mask.data(), r.B, r.T, GaeConfig{.gamma = gamma, .lambda = 1.0},
              adv1.data(), ret1.data())
              .ok());
  REQUIRE(gae(r.rewards.data(), r.values.data(), r.mask.data(), r.B, r.T, GaeConfig{.gamma = gamma, .lambda = 0.0},
              adv0.data(), ret0.data())
              .ok());
  for (size_t b = 0; b < r.B; ++b) {
    const std::vector<size_t> s = steps_of(r, b);
    for (size_t t = 0; t < s.size(); ++t) {
      double monte_carlo = 0;
      for (size_t k = t; k < s.size(); ++k) {
        monte_carlo += std::pow(gamma, static_cast<double>(k - t)) * r.rewards[s[k]];
      }
      CHECK(adv1[s[t]] == Approx(monte_carlo - r.values[s[t]]).margin(1e-12));
      CHECK(ret1[s[t]] == Approx(monte_carlo).margin(1e-12));  // the value cancels out of the return
      const double next_value = t + 1 < s.size() ? r.values[s[t + 1]] : 0.0;
      CHECK(adv0[s[t]] == Approx(r.rewards[s[t]] + gamma * next_value - r.values[s[t]]).margin(1e-12));
    }
  }
}

TEST_CASE("gae: by hand, an outcome reward on the last token of a three-token completion", "[rl][gae]") {
  // Rewards 0, 0, 1; values 0.5, 0.25, 0.75; gamma 1, lambda 0.5:
  // deltas -0.25, 0.5, 0.25; A_2 = 0.25, A_1 = 0.5 + 0.5 * 0.25 = 0.625,
  // A_0 = -0.25 + 0.5 * 0.625 = 0.0625.
  std::vector<float> rewards = {9, 0, 0, 1, 9}, values = {9, 0.5f, 0.25f, 0.75f, 9}, mask = {0, 1, 1, 1, 0};
  std::vector<float> adv(5), ret(5);
  REQUIRE(gae(rewards.data(), values.data(), mask.data(), 1, 5, GaeConfig{.gamma = 1, .lambda = 0.5}, adv.data(),
              ret.data())
              .ok());
  CHECK(adv == std::vector<float>{0, 0.0625f, 0.625f, 0.25f, 0});
  CHECK(ret == std::vector<float>{0, 0.5625f, 0.875f, 1.0f, 0});
  // No critic: the returns are the rewards-to-go.
  REQUIRE(gae(rewards.data(), static_cast<const float*>(nullptr), mask.data(), 1, 5, GaeConfig{.gamma = 1, .lambda = 1},
              adv.data(), ret.data())
              .ok());
  CHECK(ret == std::vector<float>{0, 1, 1, 1, 0});
}

TEST_CASE("gae: whitening gives the masked advantages mean 0 and standard deviation 1", "[rl][gae]") {
  Rollout r = random_rollout(3);
  std::vector<double> raw(r.B * r.T), ret_raw(r.B * r.T), adv(r.B * r.T), ret(r.B * r.T);
  REQUIRE(
      gae(r.rewards.data(), r.values.data(), r.mask.data(), r.B, r.T, GaeConfig{}, raw.data(), ret_raw.data()).ok());
  REQUIRE(gae(r.rewards.data(), r.values.data(), r.mask.data(), r.B, r.T, GaeConfig{.whiten_advantages = true},
              adv.data(), ret.data())
              .ok());
  CHECK(ret == ret_raw);  // the returns are the critic's targets: not whitened
  double count = 0, sum = 0, squares = 0, raw_mean = 0;
  for (size_t i = 0; i < adv.size(); ++i) {
    if (r.mask[i] == 0) {
      CHECK(adv[i] == 0);
      continue;
    }
    count += 1;
    sum += adv[i];
    raw_mean += raw[i];
  }
  raw_mean /= count;
  for (size_t i = 0; i < adv.size(); ++i) squares += r.mask[i] * adv[i] * adv[i];
  CHECK(sum / count == Approx(0.0).margin(1e-12));
  CHECK(squares / (count - 1) == Approx(1.0).epsilon(1e-6));  // the unbiased variance, up to the 1e-8
  // An affine map of the raw advantages that keeps their order.
  for (size_t i = 0; i < adv.size(); ++i) {
    if (r.mask[i] != 0) CHECK((adv[i] > 0) == (raw[i] > raw_mean));
  }
}

TEST_CASE("gae: bad settings are refused", "[rl][gae]") {
  std::vector<double> x(4, 1.0), mask = {0, 1, 0, 0}, out1(4), out2(4);
  CHECK_THAT(gae(x.data(), x.data(), mask.data(), 1, 4, GaeConfig{.gamma = 1.5}, out1.data(), out2.data()).message(),
             Catch::Contains("gamma"));
  CHECK_THAT(gae(x.data(), x.data(), mask.data(), 1, 4, GaeConfig{.lambda = -0.1}, out1.data(), out2.data()).message(),
             Catch::Contains("lambda"));
  CHECK_THAT(
      gae(x.data(), x.data(), mask.data(), 1, 4, GaeConfig{.lambda = std::nan("")}, out1.data(), out2.data()).message(),
      Catch::Contains("[0, 1]"));
  CHECK(gae(static_cast<const double*>(nullptr), x.data(), mask.data(), 1, 4, GaeConfig{}, out1.data(), out2.data())
            .code() == troupe::ErrorCode::invalid_argument);
  // One masked token has no variance to whiten by.
  CHECK_THAT(gae(x.data(), x.data(), mask.data(), 1, 4, GaeConfig{.whiten_advantages = true}, out1.data(), out2.data())
                 .message(),
             Catch::Contains("at least 2"));
}
