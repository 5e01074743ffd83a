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
  /// and backwards run there, in one of two ways (model/device_model.h):
  /// - resident, without a range: the parameters, the gradients and the
  ///   optimizer's moments live on the device between steps. The host's
  ///   copies are brought up to date when read (model(), optimizer(),
  ///   copy_params()) and sent back before the next step when written
  ///   (edit_model(), edit_optimizer()); the collectives take gradients().
  /// - offloaded, with a range: each forward uploads the parameters and
  ///   each backward brings the gradients back to the host, where the
  ///   optimizer and the collectives work.
  /// The device path has no entropies or values: PPO and an entropy bonus
  /// are refused (unsupported). A device that fails while the host's
  /// copies are read throws std::runtime_error (its state is lost: the
  /// caller's process should fail and restart).
  PolicyTrainer(model::Gpt<float> model, const model::AdamWConfig& optim,
                std::optional<model::ParamRange> range = std::nullopt, model::DeviceModel* device = nullptr);

  /// The model's layout (copies nothing).
  const model::ParamLayout& layout() const { return model_.layout(); }
  /// The model, its parameters current (its gradients are the host's: on a
  /// resident device, use gradients()).
  const model::Gpt<float>& model() const;
  /// The model for changing: a resident device takes its parameters again
  /// before the next step.
  model::Gpt<float>& edit_model();
  /// The optimizer, its state current.
  const model::AdamW& optimizer() const;
  /// The optimizer for changing (AdamW::restore): a resident device takes
  /// its state again before the next step.
  model::AdamW& edit_optimizer();
  /// Optimizer steps taken (without copying a resident device's state).
  size_t optimizer_steps() const;
  /// Whether the training state lives on the device (see the constructor).
  bool resident() const { return resident_; }
  /// The gradients for a collective to reduce in place between the last
  /// backward and the optimizer step: the device's (its memory) when
  /// resident, else model()'s. Errors: the device's.
  Result<float*> gradients();
  /// Copies the policy's parameters (`floats` of them, from the start of the
  /// layout) to host memory at `dst`: from a resident device when it is
  /// ahead, without going through model(). Errors: the device's.
  Status copy_params(float* dst, size_t floats) const;
  /// Resident: the device's parameters (all of the layout, in the device's
  /// memory: a CUDA pointer on a GPU) for a collective to read (a weight
  /// broadcast), the host's sent there first when they are ahead; valid
  /// until the next step or write. Errors: not resident
  /// (invalid_argument), the device's.
  Result<float*> device_params();
  /// Resident: where those parameters are, for a decoder on the same
  /// device (model::SharedParams). Errors as device_params's.
  Result<model::SharedParams> share_params();

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
  /// the sum. Errors: the device's.
  Status zero_gradients();
  /// One optimizer step with the gradients; fills the stats' grad_norm
  /// and learning_rate. Errors: the device's (nothing is known to have
  /// changed then: the state is the device's to lose).
  Status apply_gradients(StepStats& stats);
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

  // Resident: sends the host's state where the device's is behind.
  Status push();
  Status push_params();
  // Resident: brings the host's parameters / optimizer up to date.
  void pull_params() const;
  void pull_optimizer() const;

  // Mutable: the host's copies of a resident state are caches.
  mutable model::Gpt<float> model_;
  mutable model::AdamW adamw_;
  model::AdamWConfig optim_;
  model::DeviceModel* device_ = nullptr;
  bool resident_ = false;
  // Resident: which side is ahead. The device after a step (host_*_behind_),
  // the host after a write (device_*_behind_, and at the start).
  mutable bool host_params_behind_ = false, host_optimizer_behind_ = false;
  bool device_params_behind_ = true, device_optimizer_behind_ = true;
  std::vector<float> logprobs_, dlogprobs_, dlosses_, dentropy_, dvalues_, rewards_, advantages_, returns_,
      old_values_;
};

}  // namespace troupe::rl::train
