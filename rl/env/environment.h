// Multi-turn environments: the model takes a turn (its text up to EOS),
// the environment answers with an observation, a reward and whether the
// episode is done, and so on until it is. The job's rollouts play whole
// episodes this way (the observations go into the context between the
// model's turns; only the model's tokens are trained on).
//
// Episodes are replayable: an environment's reply is a function of the
// episode's index and the model's turns so far, never of hidden state that
// lives between calls. So any reward worker can take any turn, a worker
// lost mid-episode costs nothing but the call, and an episode is the same
// on every run of a config (the same first observation for a group's
// samples: GRPO's group).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>
#include <string>

#include "config/rl_config.h"

namespace troupe::rl::env {

/// The environment's answer to a turn.
struct Observation {
  /// Shown to the model before its next turn (empty when done).
  std::string text;
  /// The episode's reward so far (the last one counts).
  double reward = 0;
  bool done = false;
};

/// A replayable multi-turn environment.
class Environment {
 public:
  virtual ~Environment() = default;
  /// The first observation of `episode` (what the model continues first).
  virtual std::string first(uint64_t episode) const = 0;
  /// The observation after the model's `turns` (every turn so far, in
  /// order, each without its EOS).
  virtual Observation next(uint64_t episode, std::span<const std::string> turns) const = 0;
  /// A teacher's next turn, for warm-up data: right but for mistakes made
  /// with probability `error` per decision (drawn from `rng`).
  virtual std::string teacher_turn(uint64_t episode, std::span<const std::string> turns, double error,
                                   std::mt19937_64& rng) const = 0;
};

/// The example environment, running sums: the first observation is a sum
/// ("12+34="); each turn the model answers with the running total, and the
/// environment adds a one-digit number ("+7=") until `turns` answers are
/// in. The reward is the fraction of turns whose answer was the true
/// running total. A model has to carry the total across turns, through its
/// own (possibly wrong) answers.
class RunningSum final : public Environment {
 public:
  /// `config` (validated) gives the first sum's operands (task.problems),
  /// the turns (task.turns) and the seed.
  explicit RunningSum(const config::RlConfig& config);
  std::string first(uint64_t episode) const override;
  Observation next(uint64_t episode, std::span<const std::string> turns) const override;
  std::string teacher_turn(uint64_t episode, std::span<const std::string> turns, double error,
                           std::mt19937_64& rng) const override;

 private:
  // The episode's numbers: the first sum's operands, then each addend.
  struct Episode {
    int64_t a = 0, b = 0;
    std::vector<int64_t> addends;
  };
  Episode draw(uint64_t episode) const;

  tasks::ArithmeticConfig operands_;
  size_t turns_;
  uint64_t seed_;
};

/// The environment of a job whose task is one (config.task.kind), or
/// nullptr.
std::unique_ptr<Environment> make_environment(const config::RlConfig& config);

/// Episode indices of the held-out evaluation (apart from the RL groups').
uint64_t eval_episode(const config::RlConfig& config, size_t i);

}  // namespace troupe::rl::env
