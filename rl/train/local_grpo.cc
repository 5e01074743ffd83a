#include "train/local_grpo.h"

#include <chrono>
#include <string>

#include "algo/advantages.h"
#include "model/generate.h"
#include "model/tokenizer.h"
#include "train/batch.h"
#include "train/policy_trainer.h"

namespace troupe::rl::train {
namespace {

using model::ByteTokenizer;
using Clock = std::chrono::steady_clock;

std::vector<int32_t> prompt_tokens(const tasks::ArithmeticProblem& p) {
  std::vector<int32_t> t = {ByteTokenizer::kBos};
  auto bytes = ByteTokenizer::encode(p.prompt);
  t.insert(t.end(), bytes.begin(), bytes.end());
  return t;
}

TrainSequence supervised_sequence(const tasks::ArithmeticProblem& p) {
  TrainSequence s;
  s.prompt = prompt_tokens(p);
  s.completion = ByteTokenizer::encode(p.answer);
  s.completion.push_back(ByteTokenizer::kEos);
  return s;
}

// The reward of a completion: exact answer, ended by EOS.
double completion_reward(const tasks::ArithmeticProblem& p, const model::Completion& c) {
  if (c.stop != model::StopReason::stop_token) return 0.0;
  return tasks::ArithmeticTask::reward(p, ByteTokenizer::decode(c.tokens));
}

// Answer length bound for generation: the longest answer plus EOS, with room
// for a wrong answer one digit longer.
size_t answer_budget(const tasks::ArithmeticConfig& t) { return t.max_digits + 3; }

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

Status LocalGrpoConfig::validate() const {
  auto bad = [](const std::string& what) { return Status(ErrorCode::invalid_argument, "local grpo: " + what); };
  if (Status s = model.validate(); !s.ok()) return s;
  for (const auto* t : {&warmup_task, &rl_task, &eval_task}) {
    if (Status s = t->validate(); !s.ok()) return s;
  }
  if (model.vocab_size < static_cast<size_t>(ByteTokenizer::kVocabSize)) {
    return bad("the model's vocabulary must hold the byte tokenizer's " + std::to_string(ByteTokenizer::kVocabSize) +
               " tokens");
  }
  if (warmup_examples == 0 || warmup_batch == 0) return bad("warmup_examples and warmup_batch must be at least 1");
  if (prompts_per_step == 0 || group_size < 2) return bad("prompts_per_step >= 1 and group_size >= 2 are needed");
  if (!(warmup_carry_drop >= 0.0 && warmup_carry_drop <= 1.0)) return bad("warmup_carry_drop must be in [0, 1]");
  if (eval_problems == 0 || eval_every == 0) return bad("eval_problems and eval_every must be at least 1");
  // BOS + "a+b=" + answer + EOS must fit the context.
  const size_t digits = std::max({warmup_task.max_digits, rl_task.max_digits, eval_task.max_digits});
  const size_t need = 1 + (2 * digits + 2) + answer_budget({.min_digits = 1, .max_digits = digits});
  if (model.context_length < need) {
    return bad("context_length " + std::to_string(model.context_length) + " is too short for " +
               std::to_string(digits) + "-digit problems; it needs " + std::to_string(need));
  }
  return sampling.validate();
}

LocalGrpoConfig arithmetic_weak_teacher_run() {
  LocalGrpoConfig c;
  c.model = {.vocab_size = 259, .context_length = 16, .layers = 2, .heads = 4, .channels = 64};
  c.seed = 1;
  c.warmup_task = {.min_digits = 1, .max_digits = 2};
  c.warmup_examples = 20000;
  c.warmup_carry_drop = 0.5;
  c.warmup_steps = 2000;
  c.warmup_batch = 64;
  c.warmup_optim = {.learning_rate = 3e-3, .weight_decay = 0.1, .warmup_steps = 20};
  c.rl_task = {.min_digits = 2, .max_digits = 2};
  c.rl_steps = 100;
  c.prompts_per_step = 32;
  c.group_size = 8;
  c.sampling = {.temperature = 1.0};
  c.rl_optim = {.learning_rate = 3e-4, .weight_decay = 0.0};
  c.baseline_steps = 400;  // about the wall time of GRPO's 100 steps
  c.eval_task = {.min_digits = 2, .max_digits = 2};
  c.eval_problems = 400;
  c.eval_every = 50;
  return c;
}

Result<double> arithmetic_accuracy(const model::Gpt<float>& m, const std::vector<tasks::ArithmeticProblem>& problems) {
  std::vector<std::vector<int32_t>> prompts;
  size_t budget = 0;
  for (const auto& p : problems) {
    prompts.push_back(prompt_tokens(p));
    budget = std::max(budget, p.answer.size() + 2);
  }
  auto cache = model::KvCache::make(m.config(), std::min<size_t>(problems.size(), 256));
  if (!cache) return error(cache.error());
  model::SamplingParams greedy{.temperature = 0, .max_new_tokens = budget, .stop_token = ByteTokenizer::kEos};
  auto out = model::generate(m, *cache, prompts, greedy);
  if (!out) return error(out.error());
  double correct = 0;
  for (size_t i = 0; i < problems.size(); ++i) correct += completion_reward(problems[i], (*out)[i]);
  return correct / static_cast<double>(problems.size());
}

Result<LocalGrpoResult> run_local_grpo(const LocalGrpoConfig& config,
                                       const std::function<void(const CurvePoint&)>& progress) {
  if (Status s = config.validate(); !s.ok()) return error(s);
  auto eval_task = tasks::ArithmeticTask::make(config.eval_task, config.eval_seed);
  auto warm_task = tasks::ArithmeticTask::make(config.warmup_task, config.seed);
  auto rl_task = tasks::ArithmeticTask::make(config.rl_task, config.seed + 1);
  if (!eval_task || !warm_task || !rl_task) return error(ErrorCode::invalid_argument, "local grpo: bad task");
  const auto held_out = eval_task->take(config.eval_problems);
  auto warm_set = warm_task->take(config.warmup_examples);
  {
    std::mt19937_64 teacher(config.seed + 4);
    for (auto& p : warm_set) p.answer = tasks::ArithmeticTask::weak_teacher_answer(p, config.warmup_carry_drop, teacher);
  }

  auto gpt = model::Gpt<float>::make(config.model);
  if (!gpt) return error(gpt.error());
  gpt->init_random(config.seed);
  LocalGrpoResult result;
  const size_t context = config.model.context_length;

  auto record = [&](const std::string& phase, size_t step, double seconds, const model::Gpt<float>& m,
                    double signal) -> Result<double> {
    auto acc = arithmetic_accuracy(m, held_out);
    if (!acc) return error(acc.error());
    CurvePoint p{phase, step, seconds, *acc, signal};
    result.curve.push_back(p);
    if (progress) progress(p);
    return *acc;
  };

  // Supervised steps over the warm-up set, batches drawn in a seeded order.
  auto supervised = [&](PolicyTrainer& trainer, const std::string& phase, size_t steps, uint64_t seed) -> Status {
    std::mt19937_64 rng(seed);
    const auto start = Clock::now();
    double eval_seconds = 0, last_loss = 0;
    std::vector<TrainSequence> seqs(config.warmup_batch);
    for (size_t step = 1; step <= steps; ++step) {
      for (auto& s : seqs) s = supervised_sequence(warm_set[rng() % warm_set.size()]);
      auto batch = make_train_batch(seqs, context, ByteTokenizer::kPad);
      if (!batch) return batch.error();
      auto st = trainer.supervised_step(*batch);
      if (!st) return st.error();
      last_loss = st->loss;
      if (step % config.eval_every == 0 || step == steps) {
        const auto eval_start = Clock::now();
        auto acc = record(phase, step, seconds_since(start) - eval_seconds, trainer.model(), last_loss);
        if (!acc) return acc.error();
        eval_seconds += seconds_since(eval_start);
      }
    }
    return {};
  };

  PolicyTrainer warm(std::move(*gpt), config.warmup_optim);
  {
    auto acc = record("warmup", 0, 0, warm.model(), 0);
    if (!acc) return error(acc.error());
  }
  if (Status s = supervised(warm, "warmup", config.warmup_steps, config.seed + 2); !s.ok()) return error(s);
  result.warmup_accuracy = result.curve.back().accuracy;

  // GRPO from the warm-up's weights, with a fresh optimizer.
  {
    PolicyTrainer trainer(warm.model(), config.rl_optim);
    auto cache = model::KvCache::make(config.model, config.prompts_per_step * config.group_size);
    if (!cache) return error(cache.error());
    const auto start = Clock::now();
    double eval_seconds = 0;
    model::SamplingParams sampling = config.sampling;
    sampling.stop_token = ByteTokenizer::kEos;
    sampling.max_new_tokens = answer_budget(config.rl_task);
    for (size_t step = 1; step <= config.rl_steps; ++step) {
      const auto problems = rl_task->take(config.prompts_per_step);
      std::vector<std::vector<int32_t>> prompts;
      for (const auto& p : problems) {
        for (size_t g = 0; g < config.group_size; ++g) prompts.push_back(prompt_tokens(p));
      }
      sampling.seed = config.seed * 1000003 + step;
      auto samples = model::generate(trainer.model(), *cache, prompts, sampling);
      if (!samples) return error(samples.error());
      std::vector<double> rewards(prompts.size());
      double reward_sum = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        rewards[i] = completion_reward(problems[i / config.group_size], (*samples)[i]);
        reward_sum += rewards[i];
      }
      auto adv = algo::group_advantages(rewards, config.group_size);
      if (!adv) return error(adv.error());
      // Groups whose samples all scored the same carry no signal: leave
      // them out of the batch (their advantages are zero).
      std::vector<TrainSequence> seqs;
      for (size_t i = 0; i < prompts.size(); ++i) {
        if ((*adv)[i] == 0.0 || (*samples)[i].tokens.empty()) continue;
        seqs.push_back({prompts[i], (*samples)[i].tokens, (*samples)[i].logprobs, (*adv)[i], {}, {}});
      }
      if (!seqs.empty()) {
        auto batch = make_train_batch(seqs, context, ByteTokenizer::kPad);
        if (!batch) return error(batch.error());
        auto st = trainer.policy_step(*batch, config.loss);
        if (!st) return error(st.error());
      }
      if (step % config.eval_every == 0 || step == config.rl_steps) {
        const auto eval_start = Clock::now();
        auto acc = record("grpo", step, seconds_since(start) - eval_seconds, trainer.model(),
                          reward_sum / static_cast<double>(prompts.size()));
        if (!acc) return error(acc.error());
        eval_seconds += seconds_since(eval_start);
      }
    }
    result.grpo_accuracy = result.curve.back().accuracy;
  }

  if (config.baseline_steps > 0) {
    // More supervised training, continuing the warm-up's optimizer and data.
    PolicyTrainer baseline = warm;
    if (Status s = supervised(baseline, "supervised", config.baseline_steps, config.seed + 3); !s.ok()) {
      return error(s);
    }
    result.supervised_accuracy = result.curve.back().accuracy;
  }
  return result;
}

}  // namespace troupe::rl::train
