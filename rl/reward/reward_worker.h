// A worker of the reward mesh: judges completions against their prompts'
// references with the job's task (tasks/task.h). Verifiers run on the
// worker's CPU, away from the trainer and the engines; a slow verifier (a
// sandboxed program) holds up only its worker.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <troupe/troupe.h>

#include "config/rl_config.h"
#include "env/environment.h"

namespace troupe::rl::reward {

/// One completion to judge.
struct ScoreItem {
  std::string reference;
  std::vector<int32_t> tokens;
  /// model::StopReason of the sample.
  uint8_t stop = 0;
  TROUPE_FIELDS(reference, tokens, stop);
};

/// Judges the items; the reply has one reward per item, in order, or why
/// they could not be judged (a sandbox that cannot be made).
struct Score {
  std::vector<ScoreItem> items;
  TROUPE_MESSAGE_NAMED(Score, "troupe.rl.Score", items);
};

/// One turn of a multi-turn episode: the environment's reply to the
/// model's turns so far (env/environment.h).
struct EnvTurn {
  uint64_t episode = 0;
  std::vector<std::string> turns;
  TROUPE_FIELDS(episode, turns);
};
struct EnvReply {
  std::string text;
  double reward = 0;
  bool done = false;
  TROUPE_FIELDS(text, reward, done);
};
/// Steps the job's environment for each turn; one reply per turn, in order.
struct StepEnv {
  std::vector<EnvTurn> turns;
  TROUPE_MESSAGE_NAMED(StepEnv, "troupe.rl.StepEnv", turns);
};

/// The actor.
class RewardWorker : public Actor<RewardWorker, Score, StepEnv> {
 public:
  /// A worker of the job configured by `config_toml` (rl_config.h).
  explicit RewardWorker(std::string config_toml);

  Deferred<std::vector<double>> handle(const Score& m);
  std::vector<EnvReply> handle(const StepEnv& m);

 private:
  config::RlConfig config_;
  std::unique_ptr<env::Environment> env_;
};

}  // namespace troupe::rl::reward
