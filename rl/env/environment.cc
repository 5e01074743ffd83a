#include "env/environment.h"

#include <charconv>
#include <optional>

#include "tasks/arithmetic.h"
#include "tasks/draw.h"

namespace troupe::rl::env {
namespace {

uint64_t mix(uint64_t x) { return tasks::mix_seed(x); }

// The integer a turn's text says, if it is exactly one.
std::optional<int64_t> parse_int(const std::string& s) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

}  // namespace

RunningSum::RunningSum(const config::RlConfig& c)
    : operands_(c.task.problems), turns_(c.task.turns), seed_(c.run.seed) {}

RunningSum::Episode RunningSum::draw(uint64_t episode) const {
  auto task = tasks::ArithmeticTask::make(operands_, mix(seed_ ^ mix(episode)));
  auto p = task->next();  // validated with the config
  Episode e;
  const size_t plus = p.prompt.find('+');
  e.a = std::stoll(p.prompt.substr(0, plus));
  e.b = std::stoll(p.prompt.substr(plus + 1, p.prompt.size() - plus - 2));
  std::mt19937_64 rng(mix(seed_ + 7) ^ episode);
  for (size_t t = 1; t < turns_; ++t) e.addends.push_back(static_cast<int64_t>(rng() % 9) + 1);
  return e;
}

std::string RunningSum::first(uint64_t episode) const {
  Episode e = draw(episode);
  return std::to_string(e.a) + "+" + std::to_string(e.b) + "=";
}

Observation RunningSum::next(uint64_t episode, std::span<const std::string> turns) const {
  Episode e = draw(episode);
  int64_t total = e.a + e.b;
  size_t right = 0;
  for (size_t t = 0; t < turns.size() && t < turns_; ++t) {
    if (t > 0) total += e.addends[t - 1];
    if (parse_int(turns[t]) == total) ++right;
  }
  Observation o;
  o.reward = static_cast<double>(right) / static_cast<double>(turns_);
  o.done = turns.size() >= turns_;
  if (!o.done) o.text = "+" + std::to_string(e.addends[turns.size() - 1]) + "=";
  return o;
}

std::string RunningSum::teacher_turn(uint64_t episode, std::span<const std::string> turns, double error,
                                     std::mt19937_64& rng) const {
  Episode e = draw(episode);
  int64_t total = e.a + e.b;
  for (size_t t = 1; t <= turns.size() && t < turns_; ++t) total += e.addends[t - 1];
  // The teacher adds the last number to the true total before it, column
  // by column, dropping carries as the arithmetic teacher does.
  const int64_t last = turns.empty() ? e.b : e.addends[turns.size() - 1];
  tasks::ArithmeticProblem p{std::to_string(total - last) + "+" + std::to_string(last) + "=", std::to_string(total)};
  return tasks::ArithmeticTask::weak_teacher_answer(p, error, rng);
}

std::unique_ptr<Environment> make_environment(const config::RlConfig& c) {
  if (c.task.kind == config::TaskKind::running_sum) return std::make_unique<RunningSum>(c);
  return nullptr;
}

uint64_t eval_episode(const config::RlConfig& c, size_t i) { return (uint64_t{1} << 62) + mix(c.task.eval_seed) % (uint64_t{1} << 40) + i; }

}  // namespace troupe::rl::env
