// PolicyTrainer's PPO step with old values from before the step's updates
// (several updates per batch): given the values the training forward would
// compute itself, the step is the same bit for bit; other old values move
// the advantages and so the step.
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "model/gpt.h"
#include "train/policy_trainer.h"

using namespace troupe::rl;

namespace {

model::GptConfig critic_config() {
  return model::GptConfig{
      .vocab_size = 20, .context_length = 12, .layers = 2, .heads = 2, .channels = 16, .value_head = true};
}

train::PolicyTrainer trainer() {
  auto m = model::Gpt<float>::make(critic_config()).value();
  m.init_random(3);
  // A critic that says something (the head starts at zero).
  for (size_t c = 0; c <= m.config().channels; ++c) {
    m.params()[m.layout().value_head_w() + c] = 0.05f * static_cast<float>(c % 5) - 0.1f;
  }
  model::AdamWConfig o;
  o.learning_rate = 1e-2;
  return train::PolicyTrainer(std::move(m), o);
}

std::vector<train::TrainSequence> sequences() {
  std::vector<train::TrainSequence> seqs;
  for (int i = 0; i < 4; ++i) {
    seqs.push_back({{1, static_cast<int32_t>(2 + i)},
                    {static_cast<int32_t>(5 + i), 9, 2},
                    {-1.0f, -1.5f - 0.1f * static_cast<float>(i), -0.5f},
                    0,
                    {},
                    {}});
  }
  return seqs;
}

}  // namespace

TEST_CASE("policy trainer: PPO's old values, given, are what its advantages come from", "[rl][train]") {
  const std::vector<double> rewards = {1, 0, 1, 0};
  model::PolicyLossConfig loss;
  train::PpoConfig ppo;
  auto plain = trainer();
  auto given = trainer();
  auto other = trainer();
  auto seqs = sequences();
  auto batch = train::make_train_batch(seqs, 12, 0).value();
  // The values the training forward computes, scored first (no update).
  auto values = given.values(batch);
  REQUIRE(values);
  REQUIRE(values->size() == batch.B * batch.T);
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (size_t k = 0; k < seqs[i].completion.size(); ++k) {
      seqs[i].completion_values.push_back((*values)[i * batch.T + seqs[i].prompt.size() - 1 + k]);
    }
  }
  auto scored = train::make_train_batch(seqs, 12, 0).value();
  auto a = plain.ppo_gradients(batch, rewards, loss, ppo);
  auto b = given.ppo_gradients(scored, rewards, loss, ppo);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->loss == b->loss);
  CHECK(a->value.loss == b->value.loss);
  const size_t n = plain.model().layout().total();
  CHECK(std::memcmp(plain.model().grads(), given.model().grads(), n * sizeof(float)) == 0);
  // Other old values: other advantages, another gradient.
  for (auto& s : seqs) {
    for (float& v : s.completion_values) v += 0.5f;
  }
  auto shifted = train::make_train_batch(seqs, 12, 0).value();
  auto c = other.ppo_gradients(shifted, rewards, loss, ppo);
  REQUIRE(c);
  CHECK(c->loss != a->loss);
  CHECK(std::memcmp(plain.model().grads(), other.model().grads(), n * sizeof(float)) != 0);
  // A policy-only model has no values to score.
  auto policy = model::Gpt<float>::make(model::GptConfig{
                                            .vocab_size = 20, .context_length = 12, .layers = 1, .heads = 2, .channels = 8})
                    .value();
  train::PolicyTrainer no_critic(std::move(policy), model::AdamWConfig{});
  CHECK_FALSE(no_critic.values(batch).has_value());
}
