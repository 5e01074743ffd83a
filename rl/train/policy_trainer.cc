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
  auto st = supervised_gradients(batch);
  if (st) apply_gradients(*st);
  return st;
}

Result<StepStats> PolicyTrainer::policy_step(const TrainBatch& batch, const model::PolicyLossConfig& config,
                                             const float* ref_logprobs) {
  auto st = policy_gradients(batch, config, ref_logprobs);
  if (st) apply_gradients(*st);
  return st;
}

Result<StepStats> PolicyTrainer::supervised_gradients(const TrainBatch& batch, double grad_scale) {
  if (Status s = forward_logprobs(batch); !s.ok()) return error(s);
  const size_t n = batch.B * batch.T;
  float loss = model::masked_nll_loss(logprobs_.data(), batch.mask.data(), n, dlogprobs_.data());
  return backward(batch, loss, grad_scale);
}

Result<StepStats> PolicyTrainer::policy_gradients(const TrainBatch& batch, const model::PolicyLossConfig& config,
                                                  const float* ref_logprobs, double grad_scale) {
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
  StepStats st = backward(batch, pg->loss, grad_scale);
  st.policy = *pg;
  return st;
}

StepStats PolicyTrainer::backward(const TrainBatch& batch, double loss, double grad_scale) {
  const size_t n = batch.B * batch.T;
  dlosses_.resize(n);
  if (grad_scale != 1.0) {
    for (size_t i = 0; i < n; ++i) dlogprobs_[i] *= static_cast<float>(grad_scale);
  }
  model::to_model_dlosses(dlosses_.data(), dlogprobs_.data(), n);
  model_.zero_grad();
  model_.backward(dlosses_.data());
  StepStats st;
  st.loss = loss;
  st.completion_tokens = batch.completion_tokens;
  return st;
}

void PolicyTrainer::apply_gradients(StepStats& st) {
  st.learning_rate = adamw_.learning_rate(adamw_.steps());
  st.grad_norm = adamw_.step(model_.params(), model_.grads());
}

}  // namespace troupe::rl::train
