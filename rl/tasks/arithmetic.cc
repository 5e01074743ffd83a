#include "tasks/arithmetic.h"

#include <algorithm>

#include "tasks/draw.h"

namespace troupe::rl::tasks {

Status ArithmeticConfig::validate() const {
  if (min_digits < 1 || max_digits > 9 || min_digits > max_digits) {
    return Status(ErrorCode::invalid_argument, "arithmetic task: digits " + std::to_string(min_digits) + " to " +
                                                   std::to_string(max_digits) +
                                                   "; need 1 <= min_digits <= max_digits <= 9");
  }
  return {};
}

Result<ArithmeticTask> ArithmeticTask::make(const ArithmeticConfig& config, uint64_t seed) {
  if (Status s = config.validate(); !s.ok()) return error(s);
  return ArithmeticTask(config, seed);
}

int64_t ArithmeticTask::operand(size_t digits) {
  // Uniform over the numbers with exactly `digits` digits (0 counts as one).
  int64_t lo = 1;
  for (size_t i = 1; i < digits; ++i) lo *= 10;
  const int64_t hi = lo * 10 - 1;
  if (digits == 1) lo = 0;
  return uniform_int(rng_, lo, hi);
}

ArithmeticProblem ArithmeticTask::next() {
  const uint64_t range = config_.max_digits - config_.min_digits + 1;
  auto digits = [&] { return config_.min_digits + static_cast<size_t>(rng_() % range); };
  const int64_t a = operand(digits());
  const int64_t b = operand(digits());
  const bool minus = config_.subtraction && (rng_() & 1) != 0;
  return {std::to_string(a) + (minus ? "-" : "+") + std::to_string(b) + "=", std::to_string(minus ? a - b : a + b)};
}

std::vector<ArithmeticProblem> ArithmeticTask::take(size_t n) {
  std::vector<ArithmeticProblem> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(next());
  return out;
}

double ArithmeticTask::reward(const ArithmeticProblem& problem, std::string_view completion) {
  return completion == problem.answer ? 1.0 : 0.0;
}

std::string ArithmeticTask::weak_teacher_answer(const ArithmeticProblem& problem, double carry_drop,
                                                std::mt19937_64& rng) {
  const size_t plus = problem.prompt.find('+');
  if (plus == std::string::npos) return problem.answer;
  std::string a = problem.prompt.substr(0, plus);
  std::string b = problem.prompt.substr(plus + 1, problem.prompt.size() - plus - 2);  // drop '='
  std::string out;
  int carry = 0;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    int da = i < a.size() ? a[a.size() - 1 - i] - '0' : 0;
    int db = i < b.size() ? b[b.size() - 1 - i] - '0' : 0;
    int sum = da + db + carry;
    out.push_back(static_cast<char>('0' + sum % 10));
    carry = sum / 10;
    if (carry != 0 && uniform01(rng) < carry_drop) carry = 0;
  }
  if (carry != 0) out.push_back('1');
  while (out.size() > 1 && out.back() == '0') out.pop_back();
  return std::string(out.rbegin(), out.rend());
}

}  // namespace troupe::rl::tasks
