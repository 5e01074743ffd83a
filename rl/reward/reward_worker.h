// A worker of the reward mesh: judges completions against their prompts'
// references with the job's task (tasks/task.h). Verifiers run on the
// worker's CPU, away from the trainer and the engines; a slow verifier (a
// sandboxed program) holds up only its worker.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <troupe/troupe.h>

#include "config/rl_config.h"

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

/// The actor.
class RewardWorker : public Actor<RewardWorker, Score> {
 public:
  /// A worker of the job configured by `config_toml` (rl_config.h).
  explicit RewardWorker(std::string config_toml);

  Deferred<std::vector<double>> handle(const Score& m);

 private:
  config::RlConfig config_;
};

}  // namespace troupe::rl::reward
