#include "tasks/code.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "tasks/draw.h"

namespace troupe::rl::tasks {

namespace {

// The harness the completion runs in. It reads the completion from a file
// (any bytes: a completion is never spliced into source), compiles it as
// one expression with no builtins (no print, open or import by name), and
// prints f(x) for each x of argv, or '?' (not an int) or '!' (raised), on
// one line. Exit code 3: not an expression. The expected values stay
// outside: the caller compares.
constexpr std::string_view kHarness = R"(import sys
def run():
    try:
        src = open('completion.txt', 'rb').read().decode()
        f = eval(compile('lambda x: ' + src, '<completion>', 'eval'), {'__builtins__': {}})
    except BaseException:
        return None
    out = []
    for a in sys.argv[1:]:
        try:
            v = f(int(a))
            out.append(str(v) if type(v) is int else '?')
        except BaseException:
            out.append('!')
    return out
out = run()
if out is None:
    sys.exit(3)
sys.stdout.write(' '.join(out) + '\n')
)";

/// An expression being built, with the precedence of its outermost
/// operator (Python's: + - 1, * 2, ** 3, an atom 4), which decides where
/// the next step needs parentheses.
struct Expr {
  std::string text;
  int precedence;
};

std::string parenthesised(const Expr& e, int min_precedence) {
  return e.precedence < min_precedence ? "(" + e.text + ")" : e.text;
}

}  // namespace

Status CodeConfig::validate() const {
  auto bad = [](const std::string& what) { return Status(ErrorCode::invalid_argument, "code task: " + what); };
  if (min_steps < 1 || max_steps > 3 || min_steps > max_steps) {
    return bad("steps " + std::to_string(min_steps) + " to " + std::to_string(max_steps) +
               "; need 1 <= min_steps <= max_steps <= 3");
  }
  if (max_constant < 2 || max_constant > 99) {
    return bad("max_constant is " + std::to_string(max_constant) + "; need 2 <= max_constant <= 99");
  }
  if (test_range < 1 || test_range > 1000) {
    return bad("test_range is " + std::to_string(test_range) + "; need 1 <= test_range <= 1000");
  }
  if (tests < 1 || tests > static_cast<size_t>(2 * test_range + 1)) {
    return bad("tests is " + std::to_string(tests) + "; need 1 <= tests <= 2 * test_range + 1 (distinct inputs)");
  }
  return {};
}

Result<CodeTask> CodeTask::make(const CodeConfig& config, uint64_t seed) {
  if (Status s = config.validate(); !s.ok()) return error(s);
  return CodeTask(config, seed);
}

CodeProblem CodeTask::next() {
  const auto steps = static_cast<size_t>(
      uniform_int(rng_, static_cast<int64_t>(config_.min_steps), static_cast<int64_t>(config_.max_steps)));
  Expr e{"x", 4};
  std::vector<std::pair<char, int64_t>> ops;  // to evaluate the tests
  std::string prompt;
  for (size_t i = 0; i < steps; ++i) {
    const int64_t kind = uniform_int(rng_, 0, 3);
    int64_t k = kind == 2 ? uniform_int(rng_, 2, config_.max_constant) : uniform_int(rng_, 1, config_.max_constant);
    if (i > 0) prompt += " then ";
    switch (kind) {
      case 0:
        prompt += "add " + std::to_string(k);
        e = {e.text + "+" + std::to_string(k), 1};
        ops.emplace_back('+', k);
        break;
      case 1:
        prompt += "subtract " + std::to_string(k);
        e = {e.text + "-" + std::to_string(k), 1};
        ops.emplace_back('-', k);
        break;
      case 2:
        prompt += "times " + std::to_string(k);
        e = {parenthesised(e, 2) + "*" + std::to_string(k), 2};
        ops.emplace_back('*', k);
        break;
      default:
        // ** binds to the right, so its left operand needs parentheses
        // even when it is a power itself.
        prompt += "square";
        e = {parenthesised(e, 4) + "**2", 3};
        ops.emplace_back('^', 0);
        break;
    }
  }
  CodeProblem problem{prompt + ":", e.text, {}};
  std::vector<int64_t> xs;
  while (xs.size() < config_.tests) {
    const int64_t x = uniform_int(rng_, -config_.test_range, config_.test_range);
    if (std::find(xs.begin(), xs.end(), x) == xs.end()) xs.push_back(x);
  }
  for (int64_t x : xs) {
    int64_t v = x;
    for (auto [op, k] : ops) v = op == '+' ? v + k : op == '-' ? v - k : op == '*' ? v * k : v * v;
    problem.tests.emplace_back(x, v);
  }
  return problem;
}

std::vector<CodeProblem> CodeTask::take(size_t n) {
  std::vector<CodeProblem> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(next());
  return out;
}

std::string CodeTask::weak_teacher_answer(const CodeProblem& problem, double drop_probability,
                                          std::mt19937_64& rng) {
  const std::string& ref = problem.reference;
  std::vector<bool> drop(ref.size(), false);
  std::vector<size_t> open;
  // One draw per pair, in the order the pairs close.
  for (size_t i = 0; i < ref.size(); ++i) {
    if (ref[i] == '(') open.push_back(i);
    if (ref[i] == ')' && !open.empty()) {
      if (uniform01(rng) < drop_probability) drop[i] = drop[open.back()] = true;
      open.pop_back();
    }
  }
  std::string out;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!drop[i]) out.push_back(ref[i]);
  }
  return out;
}

reward::SandboxLimits code_limits() {
  return {.timeout_s = 2.0,
          .cpu_s = 1,
          .memory_bytes = 128ull << 20,
          .total_memory_bytes = 256ull << 20,
          .file_bytes = 64ull << 10,
          .dir_bytes = 256ull << 10,
          .open_files = 16,
          .max_processes = 4,
          .output_bytes = 4096};
}

Result<double> code_reward(const CodeProblem& problem, std::string_view completion,
                           const reward::SandboxLimits& limits) {
  reward::SandboxRun run;
  run.argv = reward::python_argv("main.py");
  for (const auto& [x, expected] : problem.tests) run.argv.push_back(std::to_string(x));
  run.files = {{"main.py", std::string(kHarness)}, {"completion.txt", std::string(completion)}};
  auto result = reward::run_sandboxed(run, limits);
  if (!result) return error(result.error());
  if (!result->succeeded() || result->out_truncated || problem.tests.empty()) return 0.0;
  // Exactly the harness's one line: anything the completion printed itself
  // spoils the line, and the score.
  const std::string& out = result->out;
  if (out.empty() || out.back() != '\n' || out.find('\n') != out.size() - 1) return 0.0;
  std::vector<std::string_view> fields;
  for (size_t pos = 0; pos < out.size();) {
    const size_t end = out.find_first_of(" \n", pos);
    fields.emplace_back(out.data() + pos, end - pos);
    pos = end + 1;
  }
  if (fields.size() != problem.tests.size()) return 0.0;
  size_t passed = 0;
  for (size_t i = 0; i < fields.size(); ++i) passed += fields[i] == std::to_string(problem.tests[i].second) ? 1 : 0;
  return static_cast<double>(passed) / static_cast<double>(problem.tests.size());
}

Result<std::vector<double>> code_rewards(std::span<const CodeProblem> problems,
                                         std::span<const std::string> completions, const reward::SandboxLimits& limits,
                                         size_t max_concurrent, size_t* runs) {
  if (problems.size() != completions.size()) {
    return error(ErrorCode::invalid_argument, "code rewards: " + std::to_string(problems.size()) + " problems for " +
                                                  std::to_string(completions.size()) +
                                                  " completions; need one problem per completion");
  }
  if (max_concurrent < 1) {
    return error(ErrorCode::invalid_argument, "code rewards: max_concurrent is 0; need at least 1");
  }
  const size_t n = problems.size();
  // One run per distinct (tests, completion): the sandbox sees nothing
  // else, so a repeat's reward is the first one's.
  using Key = std::pair<const std::vector<std::pair<int64_t, int64_t>>*, const std::string*>;
  auto less = [](const Key& a, const Key& b) {
    if (*a.second != *b.second) return *a.second < *b.second;
    return *a.first < *b.first;
  };
  std::map<Key, size_t, decltype(less)> first_of(less);
  std::vector<size_t> unique;     // indices that run
  std::vector<size_t> source(n);  // the index whose run gives i its reward
  for (size_t i = 0; i < n; ++i) {
    auto [it, inserted] = first_of.try_emplace(Key{&problems[i].tests, &completions[i]}, i);
    if (inserted) unique.push_back(i);
    source[i] = it->second;
  }
  std::vector<double> rewards(n, 0.0);
  std::vector<Status> errors(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1, std::memory_order_relaxed)) < unique.size();) {
      const size_t i = unique[k];
      auto r = code_reward(problems[i], completions[i], limits);
      if (r) {
        rewards[i] = *r;
      } else {
        errors[i] = r.error();
      }
    }
  };
  {
    std::vector<std::jthread> helpers;
    for (size_t t = 1; t < std::min(max_concurrent, unique.size()); ++t) helpers.emplace_back(work);
    work();
  }
  for (size_t i = 0; i < n; ++i) {
    if (!errors[source[i]].ok()) return error(errors[source[i]]);
    rewards[i] = rewards[source[i]];
  }
  if (runs != nullptr) *runs = unique.size();
  return rewards;
}

}  // namespace troupe::rl::tasks
