// A task as the RL job sees it, whatever the task: the prompt of each
// prompt group (a reproducible function of the job's seed and the group's
// index, so a requeued or resumed group gets the same prompt), the
// held-out evaluation set, the warm-up's labelled data, and the reward of
// a completion given the prompt's reference (an exact answer, unit tests).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "config/rl_config.h"
#include "train/batch.h"

namespace troupe::rl::tasks {

/// A prompt and what its completions are judged against.
struct TaskPrompt {
  std::string prompt;
  std::string reference;
};

/// The prompt of RL group `index`.
TaskPrompt rl_prompt(const config::RlConfig& config, uint64_t index);

/// The held-out problems (config.task.eval_problems of them, from
/// eval_seed).
std::vector<TaskPrompt> eval_prompts(const config::RlConfig& config);

/// The warm-up's labelled set (config.warmup.examples sequences: prompt
/// and the teacher's answer ended by EOS).
std::vector<train::TrainSequence> warmup_set(const config::RlConfig& config);

/// BOS followed by the prompt's bytes.
std::vector<int32_t> prompt_tokens(const std::string& prompt);

/// One completion to judge: the model's tokens (ending with EOS when it
/// stopped there) and the reference of its prompt.
struct Judged {
  const std::string* reference;
  const std::vector<int32_t>* tokens;
  bool stopped_at_eos;
};

/// The rewards of `items`, in order: arithmetic, 1 for exactly the answer
/// ended by EOS; code, the fraction of the hidden tests the expression
/// passes, run in sandboxes (config.reward.sandboxes at once). Errors: a
/// sandbox that cannot be made (why, and what to do), a reference that is
/// not the task's.
Result<std::vector<double>> task_rewards(const config::RlConfig& config, std::span<const Judged> items);

/// The sampling seed of RL group `index`.
uint64_t group_seed(const config::RlConfig& config, uint64_t index);

}  // namespace troupe::rl::tasks
