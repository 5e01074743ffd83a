#include "tasks/task.h"

#include <random>

#include "model/tokenizer.h"
#include "tasks/arithmetic.h"

namespace troupe::rl::tasks {
namespace {

using model::ByteTokenizer;

// splitmix64: spreads (seed, index) pairs over independent streams.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

TaskPrompt rl_prompt(const config::RlConfig& c, uint64_t index) {
  auto task = ArithmeticTask::make(c.task.problems, mix(mix(c.run.seed) ^ index));
  auto p = task->next();  // the config was validated: make() cannot fail
  return {p.prompt, p.answer};
}

std::vector<TaskPrompt> eval_prompts(const config::RlConfig& c) {
  auto task = ArithmeticTask::make(c.task.problems, c.task.eval_seed);
  std::vector<TaskPrompt> out;
  for (auto& p : task->take(c.task.eval_problems)) out.push_back({std::move(p.prompt), std::move(p.answer)});
  return out;
}

std::vector<train::TrainSequence> warmup_set(const config::RlConfig& c) {
  auto task = ArithmeticTask::make(c.warmup.problems, c.run.seed);
  std::mt19937_64 teacher(c.run.seed + 4);
  std::vector<train::TrainSequence> out;
  out.reserve(c.warmup.examples);
  for (const auto& p : task->take(c.warmup.examples)) {
    train::TrainSequence s;
    s.prompt = prompt_tokens(p.prompt);
    s.completion = ByteTokenizer::encode(ArithmeticTask::weak_teacher_answer(p, c.warmup.teacher_carry_drop, teacher));
    s.completion.push_back(ByteTokenizer::kEos);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<int32_t> prompt_tokens(const std::string& prompt) {
  std::vector<int32_t> t = {ByteTokenizer::kBos};
  auto bytes = ByteTokenizer::encode(prompt);
  t.insert(t.end(), bytes.begin(), bytes.end());
  return t;
}

double task_reward(const config::RlConfig&, const std::string& reference, const std::vector<int32_t>& tokens,
                   bool stopped_at_eos) {
  if (!stopped_at_eos) return 0.0;
  return ArithmeticTask::reward({"", reference}, ByteTokenizer::decode(tokens));
}

uint64_t group_seed(const config::RlConfig& c, uint64_t index) { return mix(mix(c.run.seed + 1) ^ index); }

}  // namespace troupe::rl::tasks
