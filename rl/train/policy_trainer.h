// One model under training: the policy (model/gpt.h), its optimizer
// (model/adamw.h), and the two kinds of step RL post-training takes on a
// batch (train/batch.h): a supervised step (next-token loss on the
// completions) and a policy-gradient step (model/losses.h).
#pragma once

#include <optional>

#include <cstddef>
#include <span>

#include "model/adamw.h"
#include "model/device_model.h"
#include "model/gpt.h"
#include "algo/gae.h"
#include "model/losses.h"
#include "train/batch.h"
#include "troupe/status.h"

namespace troupe::rl::train {

/// What a step did.
struct StepStats {
  double loss = 0;
  /// The gradient's global norm before clipping (NaN or infinite: the step
  /// was skipped).
  double grad_norm = 0;
  double learning_rate = 0;
  size_t completion_tokens = 0;
  /// The policy loss's parts (policy steps only).
  model::PolicyLossStats policy;
  /// The critic's loss (PPO steps only).
  model::ValueLossStats value;
};

/// PPO's settings beyond the policy loss's.
struct PpoConfig {
  algo::GaeConfig gae;
  model::ValueLossConfig value;
  /// Weight of the value loss in the total.
  double value_coef = 0.5;
};

/// A model and its optimizer. Not thread-safe.
class PolicyTrainer {
 public:
  /// Trains `model` (moved in) with AdamW under `optim`; with `range`, the
  /// optimizer keeps the state of those parameters only (ZeRO-1: see
  /// apply_gradients(StepStats&, double)). With `device` (not owned; it
  /// must outlive this trainer and be of the model's config), forwards
  /// and backwards run there: each uploads model().params() first, and the
  /// gradients come back to model().grads(), so everything else (the
  /// optimizer, the collectives, checkpoints) stays on the host. The
  /// device path has no entropies or values: PPO and an entropy bonus
  /// are refused (unsupported).
  PolicyTrainer(model::Gpt<float> model, const model::AdamWConfig& optim,
                std::optional<model::ParamRange> range = std::nullopt, model::DeviceModel* device = nullptr);

  model::Gpt<float>& model() { return model_; }
  const model::Gpt<float>& model() const { return model_; }
  model::AdamW& optimizer() { return adamw_; }

  /// One optimizer step on the mean next-token loss of the batch's
  /// completion tokens. Errors: a batch the model refuses (its message).
  Result<StepStats> supervised_step(const TrainBatch& batch);

  /// One optimizer step on the policy-gradient loss of the batch (its
  /// old_logprobs and advantages), with `ref_logprobs` (B*T, in the
  /// batch's layout) when config.kl_coef > 0. Errors: as the loss and the
  /// model give them.
  Result<StepStats> policy_step(const TrainBatch& batch, const model::PolicyLossConfig& config,
                                const float* ref_logprobs = nullptr);

  // Data parallelism splits a step in two: each rank computes the gradient
  // of its share of the batch, the ranks sum them (an allreduce of
  // model().grads()), and each applies the same sum. `grad_scale` makes the
  // sum equal the gradient of the whole batch's loss: a rank's share of the
  // loss's denominator (its tokens / all ranks' tokens for token_mean).

  /// The gradient of the supervised loss of `batch`, times `grad_scale`, in
  /// model().grads() (stats: the unscaled loss; no optimizer step).
  Result<StepStats> supervised_gradients(const TrainBatch& batch, double grad_scale = 1.0);
  /// The gradient of the policy-gradient loss of `batch` (as policy_step),
  /// times `grad_scale`, in model().grads().
  Result<StepStats> policy_gradients(const TrainBatch& batch, const model::PolicyLossConfig& config,
                                     const float* ref_logprobs = nullptr, double grad_scale = 1.0);
  /// PPO: the model must have a value head. One forward gives the
  /// policy's log-probabilities, its entropies and the critic's values; GAE
  /// over each sequence (its outcome `rewards[b]` on its last completion
  /// token) with the old values gives per-token advantages and returns; the
  /// gradient is that of the policy loss plus value_coef times the value
  /// loss, times `grad_scale`. The old values are the batch's old_values
  /// (the critic's before the step's first update: several updates per
  /// batch), or else this forward's (one update on fresh samples).
  Result<StepStats> ppo_gradients(const TrainBatch& batch, std::span<const double> rewards,
                                  const model::PolicyLossConfig& config, const PpoConfig& ppo,
                                  const float* ref_logprobs = nullptr, double grad_scale = 1.0);
  /// PPO: the critic's value at each position of `batch` (B*T), from a
  /// forward of the current weights (no gradient). Errors: no value head,
  /// a batch the model refuses.
  Result<std::vector<float>> values(const TrainBatch& batch);
  /// Zero gradients: a rank with no share of a batch still takes part in
  /// the sum.
  void zero_gradients() { model_.zero_grad(); }
  /// One optimizer step with model().grads(); fills the stats' grad_norm
  /// and learning_rate.
  void apply_gradients(StepStats& stats);
  /// ZeRO-1: the step of the optimizer's range only, with the gradient's
  /// global `norm` (the ranks' squared_norm() summed, then the root); the
  /// other parameters are the other ranks' to update.
  void apply_gradients(StepStats& stats, double norm);
  /// The squared norm of model().grads() over the optimizer's range.
  double squared_norm() const { return adamw_.squared_norm(model_.grads()); }

 private:
  // The model's forward on the batch, its log-probabilities in logprobs_.
  Status forward_logprobs(const TrainBatch& batch, bool entropy = false);
  // Backward of d loss / d logprobs (and d loss / d values and entropies,
  // when given) times grad_scale into the gradients.
  Result<StepStats> backward(const TrainBatch& batch, double loss, double grad_scale, float* dvalues = nullptr,
                             float* dentropy = nullptr);

  model::Gpt<float> model_;
  model::AdamW adamw_;
  model::DeviceModel* device_ = nullptr;
  std::vector<float> logprobs_, dlogprobs_, dlosses_, dentropy_, dvalues_, rewards_, advantages_, returns_,
      old_values_;
};

}  // namespace troupe::rl::train
