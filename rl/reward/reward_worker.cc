#include "reward/reward_worker.h"

#include <stdexcept>

#include "model/generate.h"
#include "tasks/task.h"

namespace troupe::rl::reward {

RewardWorker::RewardWorker(std::string config_toml)
    : config_(config::job_config_or_throw(config_toml, "reward worker")), env_(env::make_environment(config_)) {}

std::vector<EnvReply> RewardWorker::handle(const StepEnv& m) {
  if (!env_) fail("reward worker: this job's task is not an environment");
  std::vector<EnvReply> out;
  out.reserve(m.turns.size());
  for (const auto& t : m.turns) {
    env::Observation o = env_->next(t.episode, t.turns);
    out.push_back({std::move(o.text), o.reward, o.done});
  }
  return out;
}

Deferred<std::vector<double>> RewardWorker::handle(const Score& m) {
  auto reply = defer<std::vector<double>>();
  std::vector<tasks::Judged> items;
  items.reserve(m.items.size());
  for (const auto& item : m.items) {
    items.push_back({&item.reference, &item.tokens, item.stop == static_cast<uint8_t>(model::StopReason::stop_token)});
  }
  auto rewards = tasks::task_rewards(config_, items);
  if (rewards) {
    reply.complete(std::move(*rewards));
  } else {
    reply.fail(Status(rewards.error().code(), "reward worker: " + rewards.error().message()));
  }
  return reply;
}

}  // namespace troupe::rl::reward
