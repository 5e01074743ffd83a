#include "reward/reward_worker.h"

#include <stdexcept>

#include "model/generate.h"
#include "tasks/task.h"

namespace troupe::rl::reward {

RewardWorker::RewardWorker(std::string config_toml) {
  auto c = config::parse_rl_config(config_toml, "job config");
  if (!c) throw std::runtime_error("reward worker: " + c.error().message());
  config_ = std::move(*c);
}

std::vector<double> RewardWorker::handle(const Score& m) {
  std::vector<double> out;
  out.reserve(m.items.size());
  for (const auto& item : m.items) {
    const bool at_eos = item.stop == static_cast<uint8_t>(model::StopReason::stop_token);
    out.push_back(tasks::task_reward(config_, item.reference, item.tokens, at_eos));
  }
  return out;
}

}  // namespace troupe::rl::reward
