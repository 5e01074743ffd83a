#include "tasks/task.h"

#include <random>

#include <nlohmann/json.hpp>

#include "env/environment.h"
#include "model/tokenizer.h"
#include "tasks/arithmetic.h"
#include "tasks/draw.h"
#include "tasks/code.h"

namespace troupe::rl::tasks {
namespace {

using model::ByteTokenizer;

uint64_t mix(uint64_t x) { return mix_seed(x); }

// A code problem travels as its reference: the answer and the hidden tests.
std::string code_reference(const CodeProblem& p) {
  return nlohmann::json{{"answer", p.reference}, {"tests", p.tests}}.dump();
}

Result<CodeProblem> code_problem(const std::string& reference) {
  auto j = nlohmann::json::parse(reference, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("tests") || !j["tests"].is_array()) {
    return error(ErrorCode::malformed, "code task: a reference that is not a code problem's: " + reference.substr(0, 80));
  }
  CodeProblem p;
  p.reference = j.value("answer", std::string());
  for (const auto& t : j["tests"]) {
    if (!t.is_array() || t.size() != 2 || !t[0].is_number_integer() || !t[1].is_number_integer()) {
      return error(ErrorCode::malformed, "code task: a test that is not [x, f(x)] in " + reference.substr(0, 80));
    }
    p.tests.emplace_back(t[0].get<int64_t>(), t[1].get<int64_t>());
  }
  return p;
}

// `n` problems of the config's task from `seed`, as prompts with references
// and the teacher's answers (`teacher_error` per decision, from `teacher`).
struct Drawn {
  TaskPrompt prompt;
  std::string teacher_answer;
};
std::vector<Drawn> draw(const config::RlConfig& c, bool warmup, uint64_t seed, size_t n, std::mt19937_64* teacher) {
  std::vector<Drawn> out;
  if (c.task.kind == config::TaskKind::code) {
    auto task = CodeTask::make(c.task.code, seed);  // validated with the config
    for (auto& p : task->take(n)) {
      std::string t = teacher ? CodeTask::weak_teacher_answer(p, c.warmup.teacher_error, *teacher) : p.reference;
      out.push_back({{p.prompt, code_reference(p)}, std::move(t)});
    }
    return out;
  }
  auto task = ArithmeticTask::make(warmup ? c.warmup.problems : c.task.problems, seed);
  for (auto& p : task->take(n)) {
    std::string t = teacher ? ArithmeticTask::weak_teacher_answer(p, c.warmup.teacher_error, *teacher) : p.answer;
    out.push_back({{p.prompt, p.answer}, std::move(t)});
  }
  return out;
}

}  // namespace

TaskPrompt rl_prompt(const config::RlConfig& c, uint64_t index) {
  if (auto env = env::make_environment(c)) return {env->first(index), ""};
  return draw(c, false, mix(mix(c.run.seed) ^ index), 1, nullptr)[0].prompt;
}

std::vector<TaskPrompt> eval_prompts(const config::RlConfig& c) {
  std::vector<TaskPrompt> out;
  if (auto env = env::make_environment(c)) {
    for (size_t i = 0; i < c.task.eval_problems; ++i) out.push_back({env->first(env::eval_episode(c, i)), ""});
    return out;
  }
  for (auto& d : draw(c, false, c.task.eval_seed, c.task.eval_problems, nullptr)) out.push_back(std::move(d.prompt));
  return out;
}

std::vector<train::TrainSequence> warmup_set(const config::RlConfig& c) {
  std::mt19937_64 teacher(c.run.seed + 4);
  std::vector<train::TrainSequence> out;
  out.reserve(c.warmup.examples);
  if (auto env = env::make_environment(c)) {
    // Whole episodes played by the teacher: its turns are the labels, the
    // environment's observations between them are context.
    for (size_t i = 0; i < c.warmup.examples; ++i) {
      const uint64_t episode = (uint64_t{1} << 61) + i;
      train::TrainSequence s;
      s.prompt = prompt_tokens(env->first(episode));
      std::vector<std::string> turns;
      for (;;) {
        turns.push_back(env->teacher_turn(episode, turns, c.warmup.teacher_error, teacher));
        for (int32_t t : ByteTokenizer::encode(turns.back())) s.completion.push_back(t);
        s.completion.push_back(ByteTokenizer::kEos);
        s.completion_mask.resize(s.completion.size(), 1);
        env::Observation o = env->next(episode, turns);
        if (o.done) break;
        for (int32_t t : ByteTokenizer::encode(o.text)) s.completion.push_back(t);
        s.completion_mask.resize(s.completion.size(), 0);
      }
      out.push_back(std::move(s));
    }
    return out;
  }
  for (const auto& d : draw(c, true, c.run.seed, c.warmup.examples, &teacher)) {
    train::TrainSequence s;
    s.prompt = prompt_tokens(d.prompt.prompt);
    s.completion = ByteTokenizer::encode(d.teacher_answer);
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

Result<std::vector<double>> task_rewards(const config::RlConfig& c, std::span<const Judged> items) {
  std::vector<double> out(items.size(), 0.0);
  if (c.task.kind == config::TaskKind::arithmetic) {
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].stopped_at_eos) continue;
      out[i] = ArithmeticTask::reward({"", *items[i].reference}, ByteTokenizer::decode(*items[i].tokens));
    }
    return out;
  }
  // Code: only completions that ended run; the others score 0.
  std::vector<CodeProblem> problems;
  std::vector<std::string> completions;
  std::vector<size_t> where;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].stopped_at_eos) continue;
    auto p = code_problem(*items[i].reference);
    if (!p) return error(p.error());
    problems.push_back(std::move(*p));
    completions.push_back(ByteTokenizer::decode(*items[i].tokens));
    where.push_back(i);
  }
  auto rewards = code_rewards(problems, completions, code_limits(), c.reward.sandboxes);
  if (!rewards) return error(rewards.error());
  for (size_t k = 0; k < where.size(); ++k) out[where[k]] = (*rewards)[k];
  return out;
}

uint64_t group_seed(const config::RlConfig& c, uint64_t index) { return mix(mix(c.run.seed + 1) ^ index); }

}  // namespace troupe::rl::tasks
