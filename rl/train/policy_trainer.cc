#include "train/policy_trainer.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::rl::train {

PolicyTrainer::PolicyTrainer(model::Gpt<float> model, const model::AdamWConfig& optim,
                             std::optional<model::ParamRange> range, model::DeviceModel* device)
    : model_(std::move(model)),
      adamw_(model_.layout(), optim, range.value_or(model::ParamRange{0, model_.layout().total()})),
      optim_(optim),
      device_(device),
      resident_(device != nullptr && !range) {}

namespace {
[[noreturn]] void device_lost(const Status& s, const char* what) {
  throw std::runtime_error(std::string("policy trainer: the device failed copying ") + what +
                           " out; its training state is lost: " + s.message());
}
}  // namespace

void PolicyTrainer::pull_params() const {
  if (!host_params_behind_) return;
  if (Status s = device_->download_params(model_.params()); !s.ok()) device_lost(s, "the parameters");
  host_params_behind_ = false;
}

void PolicyTrainer::pull_optimizer() const {
  if (!host_optimizer_behind_) return;
  const size_t n = model_.layout().total();
  std::vector<float> m(n), v(n);
  if (Status s = device_->download_adamw_state(m.data(), v.data()); !s.ok()) device_lost(s, "the optimizer's state");
  if (Status s = adamw_.restore(std::move(m), std::move(v), device_->adamw_steps()); !s.ok()) {
    device_lost(s, "the optimizer's state");
  }
  host_optimizer_behind_ = false;
}

Status PolicyTrainer::push_params() {
  if (device_params_behind_) {
    if (Status s = device_->upload_params(model_.params()); !s.ok()) return s;
    device_params_behind_ = false;
  }
  return {};
}

Result<float*> PolicyTrainer::device_params() {
  if (!resident_) {
    return error(ErrorCode::invalid_argument,
                 "policy trainer: the parameters are not resident on a device (no device, or ZeRO-1's range); read "
                 "them with copy_params");
  }
  if (Status s = push_params(); !s.ok()) return error(s);
  return device_->device_params();
}

Result<model::SharedParams> PolicyTrainer::share_params() {
  if (auto p = device_params(); !p) return error(p.error());
  return device_->share_params();
}

Status PolicyTrainer::push() {
  if (Status s = push_params(); !s.ok()) return s;
  if (device_optimizer_behind_) {
    if (Status s = device_->restore_adamw_state(adamw_.m().data(), adamw_.v().data(), adamw_.steps()); !s.ok()) {
      return s;
    }
    device_optimizer_behind_ = false;
  }
  return {};
}

const model::Gpt<float>& PolicyTrainer::model() const {
  pull_params();
  return model_;
}

model::Gpt<float>& PolicyTrainer::edit_model() {
  pull_params();
  if (resident_) device_params_behind_ = true;
  return model_;
}

const model::AdamW& PolicyTrainer::optimizer() const {
  pull_optimizer();
  return adamw_;
}

model::AdamW& PolicyTrainer::edit_optimizer() {
  pull_optimizer();
  if (resident_) device_optimizer_behind_ = true;
  return adamw_;
}

size_t PolicyTrainer::optimizer_steps() const {
  return resident_ && !device_optimizer_behind_ ? device_->adamw_steps() : adamw_.steps();
}

Result<float*> PolicyTrainer::gradients() {
  if (!resident_) return model_.grads();
  return device_->device_grads();
}

Status PolicyTrainer::copy_params(float* dst, size_t floats) const {
  if (floats > model_.layout().total()) {
    return Status(ErrorCode::invalid_argument, "policy trainer: " + std::to_string(floats) +
                                                   " parameters asked for; the model has " +
                                                   std::to_string(model_.layout().total()));
  }
  if (!host_params_behind_) {
    std::memcpy(dst, model_.params(), floats * sizeof(float));
    return {};
  }
  if (floats == model_.layout().total()) return device_->download_params(dst);
  pull_params();
  std::memcpy(dst, model_.params(), floats * sizeof(float));
  return {};
}

Status PolicyTrainer::forward_logprobs(const TrainBatch& batch, bool entropy) {
  const size_t n = batch.B * batch.T;
  logprobs_.resize(n);
  dlogprobs_.resize(n);
  if (device_ != nullptr) {
    if (entropy) {
      return Status(ErrorCode::unsupported, "policy trainer: the device model computes no entropies (an entropy "
                                            "bonus, or PPO): train on the CPU model");
    }
    if (resident_) {
      if (Status s = push(); !s.ok()) return s;
    } else if (Status s = device_->upload_params(model_.params()); !s.ok()) {
      // Offloaded: the host's parameters are the master copy; the
      // optimizer, a copied state or a collective may have changed them.
      return s;
    }
    if (Status s = device_->forward(batch.tokens.data(), batch.targets.data(), batch.B, batch.T, logprobs_.data());
        !s.ok()) {
      return s;
    }
    for (float& l : logprobs_) l = -l;
    return {};
  }
  if (Status s = model_.forward(batch.tokens.data(), batch.targets.data(), batch.B, batch.T, {.entropy = entropy});
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < n; ++i) logprobs_[i] = -model_.losses()[i];
  return {};
}

Result<StepStats> PolicyTrainer::supervised_step(const TrainBatch& batch) {
  auto st = supervised_gradients(batch);
  if (!st) return st;
  if (Status s = apply_gradients(*st); !s.ok()) return error(s);
  return st;
}

Result<StepStats> PolicyTrainer::policy_step(const TrainBatch& batch, const model::PolicyLossConfig& config,
                                             const float* ref_logprobs) {
  auto st = policy_gradients(batch, config, ref_logprobs);
  if (!st) return st;
  if (Status s = apply_gradients(*st); !s.ok()) return error(s);
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
  auto st = backward(batch, pg->loss, grad_scale);
  if (st) st->policy = *pg;
  return st;
}

Result<StepStats> PolicyTrainer::ppo_gradients(const TrainBatch& batch, std::span<const double> rewards,
                                               const model::PolicyLossConfig& config, const PpoConfig& ppo,
                                               const float* ref_logprobs, double grad_scale) {
  if (!model_.config().value_head) {
    return error(ErrorCode::invalid_argument, "ppo: the model has no value head (GptConfig::value_head)");
  }
  if (device_ != nullptr) {
    return error(ErrorCode::unsupported, "ppo: the device model has no value head: train PPO on the CPU model");
  }
  if (rewards.size() != batch.B) {
    return error(ErrorCode::invalid_argument, "ppo: " + std::to_string(rewards.size()) + " rewards for " +
                                                  std::to_string(batch.B) + " sequences");
  }
  const bool entropy = config.entropy_coef > 0;
  if (Status s = forward_logprobs(batch, entropy); !s.ok()) return error(s);
  const size_t B = batch.B, T = batch.T, n = B * T;
  // The outcome reward on each sequence's last completion token.
  rewards_.assign(n, 0.0f);
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = T; t-- > 0;) {
      if (batch.mask[b * T + t] != 0) {
        rewards_[b * T + t] = static_cast<float>(rewards[b]);
        break;
      }
    }
  }
  if (batch.old_values.empty()) {
    old_values_.assign(model_.values(), model_.values() + n);
  } else {
    old_values_ = batch.old_values;
  }
  advantages_.resize(n);
  returns_.resize(n);
  if (Status s = algo::gae(rewards_.data(), old_values_.data(), batch.mask.data(), B, T, ppo.gae, advantages_.data(),
                           returns_.data());
      !s.ok()) {
    return error(s);
  }
  model::PolicyLossInputs<float> in{.B = B,
                                    .T = T,
                                    .logprobs = logprobs_.data(),
                                    .old_logprobs = batch.old_logprobs.data(),
                                    .ref_logprobs = ref_logprobs,
                                    .advantages = advantages_.data(),
                                    .mask = batch.mask.data(),
                                    .entropies = entropy ? model_.entropies() : nullptr};
  dentropy_.assign(n, 0.0f);
  auto pg = model::policy_gradient_loss(in, config, dlogprobs_.data(), entropy ? dentropy_.data() : nullptr);
  if (!pg) return error(pg.error());
  dvalues_.resize(n);
  model::ValueLossInputs<float> vin{.B = B,
                                    .T = T,
                                    .values = model_.values(),
                                    .old_values = old_values_.data(),
                                    .returns = returns_.data(),
                                    .mask = batch.mask.data()};
  auto vl = model::value_loss(vin, ppo.value, dvalues_.data());
  if (!vl) return error(vl.error());
  for (float& d : dvalues_) d *= static_cast<float>(ppo.value_coef);
  auto st = backward(batch, pg->loss + ppo.value_coef * vl->loss, grad_scale, dvalues_.data(),
                     entropy ? dentropy_.data() : nullptr);
  if (st) {
    st->policy = *pg;
    st->value = *vl;
  }
  return st;
}

Result<std::vector<float>> PolicyTrainer::values(const TrainBatch& batch) {
  if (!model_.config().value_head) {
    return error(ErrorCode::invalid_argument, "ppo: the model has no value head (GptConfig::value_head)");
  }
  if (device_ != nullptr) {
    return error(ErrorCode::unsupported, "ppo: the device model has no value head: train PPO on the CPU model");
  }
  if (Status s = model_.forward(batch.tokens.data(), batch.targets.data(), batch.B, batch.T); !s.ok()) return error(s);
  return std::vector<float>(model_.values(), model_.values() + batch.B * batch.T);
}

Result<StepStats> PolicyTrainer::backward(const TrainBatch& batch, double loss, double grad_scale, float* dvalues,
                                          float* dentropy) {
  const size_t n = batch.B * batch.T;
  dlosses_.resize(n);
  if (grad_scale != 1.0) {
    const auto g = static_cast<float>(grad_scale);
    for (size_t i = 0; i < n; ++i) dlogprobs_[i] *= g;
    for (float* d : {dvalues, dentropy}) {
      if (d == nullptr) continue;
      for (size_t i = 0; i < n; ++i) d[i] *= g;
    }
  }
  model::to_model_dlosses(dlosses_.data(), dlogprobs_.data(), n);
  if (resident_) {
    // forward_logprobs refused what needs dvalues or dentropy here.
    if (Status s = device_->zero_grad(); !s.ok()) return error(s);
    if (Status s = device_->accumulate_grads(dlosses_.data()); !s.ok()) return error(s);
  } else if (device_ != nullptr) {
    if (Status s = device_->backward(dlosses_.data(), model_.grads()); !s.ok()) return error(s);
  } else {
    model_.zero_grad();
    model_.backward(dlosses_.data(), dvalues, dentropy);
  }
  StepStats st;
  st.loss = loss;
  st.completion_tokens = batch.completion_tokens;
  return st;
}

Status PolicyTrainer::zero_gradients() {
  if (!resident_) {
    model_.zero_grad();
    return {};
  }
  if (Status s = push(); !s.ok()) return s;
  return device_->zero_grad();
}

Status PolicyTrainer::apply_gradients(StepStats& st) {
  st.learning_rate = adamw_.learning_rate(optimizer_steps());
  if (!resident_) {
    st.grad_norm = adamw_.step(model_.params(), model_.grads());
    return {};
  }
  if (Status s = push(); !s.ok()) return s;
  auto norm = device_->adamw_step(optim_);
  // Even a failed step may have changed the device's state in part.
  host_params_behind_ = host_optimizer_behind_ = true;
  if (!norm) return norm.error();
  st.grad_norm = *norm;
  return {};
}

void PolicyTrainer::apply_gradients(StepStats& st, double norm) {
  st.learning_rate = adamw_.learning_rate(adamw_.steps());
  st.grad_norm = adamw_.apply(model_.params(), model_.grads(), norm);
}

}  // namespace troupe::rl::train
