// One model under training: the policy (model/gpt.h), its optimizer
// (model/adamw.h), and the two kinds of step RL post-training takes on a
// batch (train/batch.h): a supervised step (next-token loss on the
// completions) and a policy-gradient step (model/losses.h).
#pragma once

#include <cstddef>

#include "model/adamw.h"
#include "model/gpt.h"
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
};

/// A model and its optimizer. Not thread-safe.
class PolicyTrainer {
 public:
  /// Trains `model` (moved in) with AdamW under `optim`.
  PolicyTrainer(model::Gpt<float> model, const model::AdamWConfig& optim);

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

 private:
  // The model's forward on the batch, its log-probabilities in logprobs_.
  Status forward_logprobs(const TrainBatch& batch);
  // Backward of d loss / d logprobs, then the optimizer step.
  StepStats finish_step(const TrainBatch& batch, double loss);

  model::Gpt<float> model_;
  model::AdamW adamw_;
  std::vector<float> logprobs_, dlogprobs_, dlosses_;
};

}  // namespace troupe::rl::train
