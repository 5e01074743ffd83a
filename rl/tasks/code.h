// A code-writing task for RL, scored by running the code: the prompt
// describes a function of x in words, `add 3 then times 2:`, the
// completion is a Python expression in x, `(x+3)*2`, and the reward is the
// fraction of hidden unit tests that `lambda x: <completion>` passes, run
// in a sandbox (reward/sandbox.h). Short enough for a byte-level model with
// a context of 40 tokens; problems come from a seeded stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reward/sandbox.h"
#include "troupe/status.h"

namespace troupe::rl::tasks {

/// One problem: the prompt the model continues, a right answer, and the
/// hidden tests (x, f(x)). Only the inputs enter the sandbox: a completion
/// cannot read the expected values, only compute them.
struct CodeProblem {
  std::string prompt;     // e.g. "add 3 then times 2:"
  std::string reference;  // e.g. "(x+3)*2"
  std::vector<std::pair<int64_t, int64_t>> tests;
};

/// Which problems a stream draws.
struct CodeConfig {
  /// Each problem chains a number of steps drawn uniformly from [min_steps,
  /// max_steps]; a step is "add k", "subtract k", "times k" or "square".
  /// Two steps: 5 problems in 16 need parentheses (one step never does).
  size_t min_steps = 2;
  size_t max_steps = 2;
  /// Constants k are drawn from [1, max_constant] (times: from 2).
  int64_t max_constant = 9;
  /// Hidden tests per problem, at distinct x drawn from [-test_range,
  /// test_range].
  size_t tests = 5;
  int64_t test_range = 10;

  /// ok, or what is out of range, named.
  Status validate() const;
};

/// A reproducible stream of problems.
class CodeTask {
 public:
  /// A stream of `config` (validated) from `seed`.
  static Result<CodeTask> make(const CodeConfig& config, uint64_t seed);

  /// The next problem of the stream.
  CodeProblem next();
  /// The next `n` problems.
  std::vector<CodeProblem> take(size_t n);

  /// A weak teacher's answer: the reference with each pair of parentheses
  /// dropped with probability `drop_probability` (drawn from `rng`), so
  /// `(x+3)*2` may become `x+3*2`. Right on problems that need no
  /// parentheses, wrong (on most tests) where a dropped pair changes the
  /// value: a model distilled from it inherits the doubt, and the tests'
  /// reward can remove it. At 0.75 the teacher is wrong more often than
  /// right where parentheses are needed, so a model's greedy answer is too,
  /// while its samples still hold the right one at times (what GRPO needs).
  static std::string weak_teacher_answer(const CodeProblem& problem, double drop_probability, std::mt19937_64& rng);

 private:
  CodeTask(CodeConfig config, uint64_t seed) : config_(config), rng_(seed) {}

  CodeConfig config_;
  std::mt19937_64 rng_;
};

/// Limits that fit one expression: a second of wall time, a CPU second,
/// 128 MiB of address space, 4 processes, 4 KiB of output.
reward::SandboxLimits code_limits();

/// The fraction of `problem`'s tests that `lambda x: <completion>` passes
/// (an int equal to the expected value), run in one sandbox under
/// `limits`. Anything that is not a Python expression, raises, loops past
/// the limits or prints scores 0 on the tests it spoils. An error only
/// when the sandbox cannot run (see run_sandboxed).
Result<double> code_reward(const CodeProblem& problem, std::string_view completion,
                           const reward::SandboxLimits& limits = code_limits());

/// code_reward of `completions[i]` against `problems[i]` for every i
/// (same lengths), at most `max_concurrent` sandboxes at a time (threads of
/// this call; at least 1). The rewards are those of the serial calls; the
/// error is that of the first index that failed. A completion that repeats
/// an earlier one on the same tests (a group's samples often agree) is run
/// once and takes that run's reward; `runs`, where given, is set to the
/// number of sandboxed runs made.
Result<std::vector<double>> code_rewards(std::span<const CodeProblem> problems,
                                         std::span<const std::string> completions, const reward::SandboxLimits& limits,
                                         size_t max_concurrent, size_t* runs = nullptr);

}  // namespace troupe::rl::tasks
