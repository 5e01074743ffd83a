#include "train/policy_trainer.h"

namespace troupe::rl::train {

PolicyTrainer::PolicyTrainer(model::Gpt<float> model, const model::AdamWConfig& optim)
    : model_(std::move(model)), adamw_(model_.layout(), optim) {}

Status PolicyTrainer::forward_logprobs(const TrainBatch& batch) {
  if (Status s = model_.forward(batch.tokens.data(), batch.targets.data(), batch.B, batch.T); !s.ok()) return s;
  const size_t n = batch.B * batch.T;
  logprobs_.resize(n);
  dlogprobs_.resize(n);
  for (size_t i = 0; i < n; ++i) logprobs_[i] = -model_.losses()[i];
  return {};
}

Result<StepStats> PolicyTrainer::supervised_step(const TrainBatch& batch) {
  if (Status s = forward_logprobs(batch); !s.ok()) return error(s);
  const size_t n = batch.B * batch.T;
  float loss = model::masked_nll_loss(logprobs_.data(), batch.mask.data(), n, dlogprobs_.data());
  return finish_step(batch, loss);
}

Result<StepStats> PolicyTrainer::policy_step(const TrainBatch& batch, const model::PolicyLossConfig& config,
                                             const float* ref_logprobs) {
  if (Status s = forward_logprobs(batch); !s.ok()) return error(s);
  model::PolicyLossInputs<float> in{.B = batch.B,
                                    .T = batch.T,
                                    .logprobs = logprobs_.data(),
                                    .old_logprobs = batch.old_logprobs.data(),
                                    .ref_logprobs = ref_logprobs,
                                    .advantages = batch.advantages.data(),
                                    .mask = batch.mask.data()};
  auto pg = model::policy_gradient_loss(in, config, dlogprobs_.data());
  if (!pg) return error(pg.error());
  StepStats st = finish_step(batch, pg->loss);
  st.policy = *pg;
  return st;
}

StepStats PolicyTrainer::finish_step(const TrainBatch& batch, double loss) {
  const size_t n = batch.B * batch.T;
  dlosses_.resize(n);
  model::to_model_dlosses(dlosses_.data(), dlogprobs_.data(), n);
  model_.zero_grad();
  model_.backward(dlosses_.data());
  StepStats st;
  st.loss = loss;
  st.learning_rate = adamw_.learning_rate(adamw_.steps());
  st.grad_norm = adamw_.step(model_.params(), model_.grads());
  st.completion_tokens = batch.completion_tokens;
  return st;
}

}  // namespace troupe::rl::train
