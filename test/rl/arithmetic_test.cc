// The arithmetic task, the GRPO advantages and the training batches: the
// task's problems are right and reproducible, its reward exact; group
// advantages are centred (and scaled) per group; batches put each
// completion token where the model predicts it.
#include <map>
#include <random>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "algo/advantages.h"
#include "model/tokenizer.h"
#include "tasks/arithmetic.h"
#include "train/batch.h"

using namespace troupe::rl;

TEST_CASE("arithmetic: problems are correct, within the digit range, and the same for the same seed", "[rl][task]") {
  auto task = tasks::ArithmeticTask::make({.min_digits = 2, .max_digits = 3, .subtraction = true}, 9).value();
  auto again = tasks::ArithmeticTask::make({.min_digits = 2, .max_digits = 3, .subtraction = true}, 9).value();
  std::set<char> ops;
  std::set<size_t> lengths;
  for (int i = 0; i < 2000; ++i) {
    auto p = task.next();
    auto q = again.next();
    REQUIRE(p.prompt == q.prompt);
    REQUIRE(p.answer == q.answer);
    size_t op = p.prompt.find_first_of("+-");
    REQUIRE(op != std::string::npos);
    REQUIRE(p.prompt.back() == '=');
    std::string a = p.prompt.substr(0, op), b = p.prompt.substr(op + 1, p.prompt.size() - op - 2);
    lengths.insert(a.size());
    lengths.insert(b.size());
    CHECK(a.size() >= 2);
    CHECK(b.size() <= 3);
    CHECK(a[0] != '0');
    long expect = p.prompt[op] == '+' ? std::stol(a) + std::stol(b) : std::stol(a) - std::stol(b);
    CHECK(p.answer == std::to_string(expect));
    ops.insert(p.prompt[op]);
  }
  CHECK(ops.size() == 2);
  CHECK(lengths == std::set<size_t>{2, 3});
  auto other = tasks::ArithmeticTask::make({.min_digits = 2, .max_digits = 3}, 10).value();
  auto first = tasks::ArithmeticTask::make({.min_digits = 2, .max_digits = 3}, 9).value();
  CHECK(other.take(5)[4].prompt != first.take(5)[4].prompt);
}

TEST_CASE("arithmetic: the reward is 1 for exactly the answer and 0 for anything else", "[rl][task]") {
  tasks::ArithmeticProblem p{"12+345=", "357"};
  CHECK(tasks::ArithmeticTask::reward(p, "357") == 1.0);
  for (const char* wrong : {"356", "3570", "0357", " 357", "357 ", "", "-357"}) {
    CHECK(tasks::ArithmeticTask::reward(p, wrong) == 0.0);
  }
  CHECK_THAT(tasks::ArithmeticTask::make({.min_digits = 0, .max_digits = 3}, 1).error().message(),
             Catch::Contains("min_digits"));
  CHECK(!tasks::ArithmeticTask::make({.min_digits = 4, .max_digits = 3}, 1));
  CHECK(!tasks::ArithmeticTask::make({.min_digits = 1, .max_digits = 10}, 1));
}

TEST_CASE("arithmetic: the weak teacher is right without carries and drops each carry at its rate", "[rl][task]") {
  std::mt19937_64 rng(3);
  tasks::ArithmeticProblem no_carry{"12+34=", "46"}, two_carries{"58+67=", "125"};
  CHECK(tasks::ArithmeticTask::weak_teacher_answer(no_carry, 1.0, rng) == "46");
  CHECK(tasks::ArithmeticTask::weak_teacher_answer(two_carries, 0.0, rng) == "125");
  CHECK(tasks::ArithmeticTask::weak_teacher_answer(two_carries, 1.0, rng) == "15");  // 8+7 -> 5, 5+6 -> 1, both carries dropped
  std::map<std::string, int> seen;
  for (int i = 0; i < 4000; ++i) seen[tasks::ArithmeticTask::weak_teacher_answer(two_carries, 0.5, rng)] += 1;
  // Units carry kept or not (x2), tens carry kept or not (x2): 125, 115, 25, 15.
  CHECK(seen.size() == 4);
  CHECK(seen["125"] == Approx(1000).margin(120));
  CHECK(seen["15"] == Approx(1000).margin(120));
  tasks::ArithmeticProblem minus{"58-67=", "-9"};
  CHECK(tasks::ArithmeticTask::weak_teacher_answer(minus, 1.0, rng) == "-9");
  CHECK(tasks::ArithmeticTask::weak_teacher_answer({"50+50=", "100"}, 1.0, rng) == "0");
}

TEST_CASE("group advantages: centred per group, scaled by the group's deviation, zero for uniform groups",
          "[rl][algo]") {
  std::vector<double> rewards = {1, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1};
  auto adv = algo::group_advantages(rewards, 4).value();
  // Group 0: mean 0.25, sample std sqrt(0.25) = 0.5.
  CHECK(adv[0] == Approx(0.75 / 0.5).epsilon(1e-5));
  CHECK(adv[1] == Approx(-0.25 / 0.5).epsilon(1e-5));
  for (size_t i = 4; i < 8; ++i) CHECK(adv[i] == 0.0);
  CHECK(adv[8] == Approx(-0.5 / std::sqrt(1.0 / 3.0)).epsilon(1e-5));  // mean 0.5, sample std sqrt(1/3)
  double sum = 0;
  for (size_t i = 8; i < 12; ++i) sum += adv[i];
  CHECK(sum == Approx(0).margin(1e-12));
  auto centred = algo::group_advantages(rewards, 4, {.scale_by_std = false}).value();
  CHECK(centred[0] == Approx(0.75));
  CHECK_THAT(algo::group_advantages(rewards, 5).error().message(), Catch::Contains("groups of 5"));
  CHECK(!algo::group_advantages(rewards, 0));
}

TEST_CASE("train batch: completion tokens are masked in where the model predicts them, with their logprobs",
          "[rl][train]") {
  using model::ByteTokenizer;
  const int32_t pad = ByteTokenizer::kPad;
  std::vector<train::TrainSequence> seqs = {
      {{256, 49, 61}, {50, 257}, {-0.5f, -0.25f}, 1.5, {}, {}},  // "1=" -> "2" EOS
      {{256, 61}, {51, 52, 257}, {-1.f, -2.f, -3.f}, -0.5, {}, {}},
  };
  auto b = train::make_train_batch(seqs, 8, pad).value();
  REQUIRE(b.B == 2);
  REQUIRE(b.T == 4);  // longest is 5 tokens
  CHECK(b.tokens == std::vector<int32_t>{256, 49, 61, 50, 256, 61, 51, 52});
  CHECK(b.targets == std::vector<int32_t>{49, 61, 50, 257, 61, 51, 52, 257});
  CHECK(b.mask == std::vector<float>{0, 0, 1, 1, 0, 1, 1, 1});
  CHECK(b.old_logprobs == std::vector<float>{0, 0, -0.5f, -0.25f, 0, -1, -2, -3});
  CHECK(b.advantages == std::vector<float>{0, 0, 1.5f, 1.5f, 0, -0.5f, -0.5f, -0.5f});
  CHECK(b.completion_tokens == 5);

  std::vector<train::TrainSequence> padded = {{{256}, {50}, {}, 0, {}, {}}, {{256, 1, 2, 3}, {4}, {}, 0, {}, {}}};
  auto p = train::make_train_batch(padded, 8, pad).value();
  CHECK(p.tokens == std::vector<int32_t>{256, pad, pad, pad, 256, 1, 2, 3});
  CHECK(p.mask == std::vector<float>{1, 0, 0, 0, 0, 0, 0, 1});

  std::vector<train::TrainSequence> too_long = {{{256, 1, 2, 3, 4}, {5, 6, 7, 8, 9}, {}, 0, {}, {}}};
  CHECK_THAT(train::make_train_batch(too_long, 8, pad).error().message(), Catch::Contains("at most 9"));
  std::vector<train::TrainSequence> empty = {{{}, {1}, {}, 0, {}, {}}};
  CHECK(!train::make_train_batch(empty, 8, pad));
  std::vector<train::TrainSequence> bad_lp = {{{256}, {1, 2}, {-1.f}, 0, {}, {}}};
  CHECK_THAT(train::make_train_batch(bad_lp, 8, pad).error().message(), Catch::Contains("1 logprobs for 2"));
  // A multi-turn completion: the environment's tokens between the model's
  // turns are context, not trained on.
  std::vector<train::TrainSequence> turns = {{{256, 49}, {50, 257, 43, 51}, {-1.f, -1.f, 0.f, -1.f}, 2.0, {1, 1, 0, 1}, {}}};
  auto tb = train::make_train_batch(turns, 8, pad).value();
  CHECK(tb.mask == std::vector<float>{0, 1, 1, 0, 1});
  CHECK(tb.advantages == std::vector<float>{0, 2, 2, 0, 2});
  CHECK(tb.completion_tokens == 3);
  std::vector<train::TrainSequence> bad_mask = {{{256}, {1, 2}, {}, 0, {1}, {}}};
  CHECK_THAT(train::make_train_batch(bad_mask, 8, pad).error().message(), Catch::Contains("mask of 1 for 2"));
  // PPO's old values sit where the logprobs do; all sequences have them or none.
  std::vector<train::TrainSequence> valued = {{{256, 49, 61}, {50, 257}, {-0.5f, -0.25f}, 1.5, {}, {0.25f, 0.5f}},
                                              {{256, 61}, {51, 52, 257}, {-1.f, -2.f, -3.f}, -0.5, {}, {1, 2, 3}}};
  auto vb = train::make_train_batch(valued, 8, pad).value();
  CHECK(vb.old_values == std::vector<float>{0, 0, 0.25f, 0.5f, 0, 1, 2, 3});
  CHECK(b.old_values.empty());
  valued[1].completion_values.clear();
  CHECK_THAT(train::make_train_batch(valued, 8, pad).error().message(), Catch::Contains("old values"));
  valued[1].completion_values = {1, 2};
  CHECK_THAT(train::make_train_batch(valued, 8, pad).error().message(), Catch::Contains("2 values for 3"));
  CHECK(!train::make_train_batch(std::vector<train::TrainSequence>{}, 8, pad));
}
