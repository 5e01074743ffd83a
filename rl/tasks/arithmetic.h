// A verifiable task for RL: integer addition and subtraction written as
// text, `12+345=` -> `357`, with an exact reward (1 for exactly the answer,
// 0 otherwise). Problems come from a seeded stream, so a held-out
// evaluation set is the same on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/status.h"

namespace troupe::rl::tasks {

/// One problem: the prompt the model continues and the exact answer.
struct ArithmeticProblem {
  std::string prompt;  // e.g. "12+345="
  std::string answer;  // e.g. "357"
};

/// Which problems a stream draws.
struct ArithmeticConfig {
  /// Each operand has a digit count drawn uniformly from [min_digits,
  /// max_digits] (1-digit operands include 0).
  size_t min_digits = 1;
  size_t max_digits = 3;
  /// Subtraction problems (answers may be negative: "3-45=" -> "-42").
  bool subtraction = false;

  /// ok, or what is out of range (digits 1 to 9, min <= max).
  Status validate() const;
};

/// A reproducible stream of problems.
class ArithmeticTask {
 public:
  /// A stream of `config` (validated) from `seed`.
  static Result<ArithmeticTask> make(const ArithmeticConfig& config, uint64_t seed);

  /// The next problem of the stream.
  ArithmeticProblem next();
  /// The next `n` problems.
  std::vector<ArithmeticProblem> take(size_t n);

  /// 1 when `completion` (the model's text after the prompt, special tokens
  /// removed) is exactly the answer, else 0.
  static double reward(const ArithmeticProblem& problem, std::string_view completion);

  /// A weak teacher's answer to `problem`: column addition that drops
  /// each carry with probability `carry_drop` (drawn from `rng`), so its
  /// labels are right on problems without carries and a coin toss per
  /// carry otherwise. Subtraction problems get the exact answer. A model
  /// trained on such labels learns the teacher's doubt; the exact reward
  /// can remove it, more of the same labels cannot.
  static std::string weak_teacher_answer(const ArithmeticProblem& problem, double carry_drop, std::mt19937_64& rng);

 private:
  ArithmeticTask(ArithmeticConfig config, uint64_t seed) : config_(config), rng_(seed) {}
  int64_t operand(size_t digits);

  ArithmeticConfig config_;
  std::mt19937_64 rng_;
};

}  // namespace troupe::rl::tasks
