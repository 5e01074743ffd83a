// The single-process learning run that proves the model and the losses
// learn (no actors): a supervised warm-up from scratch on a fixed set of
// labelled arithmetic problems, then GRPO on fresh prompts with only the
// verifier's reward, beside a baseline that spends the same steps on more
// supervised training on the warm-up set. Both curves are evaluated on the
// same held-out problems (greedy decoding, exact answers).
//
// This is the loop the RL issue distributes across meshes; here it is in
// one process so that the learning itself is tested on 2 CPU cores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/adamw.h"
#include "model/config.h"
#include "model/gpt.h"
#include "model/losses.h"
#include "model/sampler.h"
#include "tasks/arithmetic.h"
#include "troupe/status.h"

namespace troupe::rl::train {

/// Everything a learning run does.
struct LocalGrpoConfig {
  model::GptConfig model;
  uint64_t seed = 1;

  /// Warm-up: `warmup_examples` labelled problems of `warmup_task`, drawn
  /// once; `warmup_steps` steps of `warmup_batch` problems from that set.
  tasks::ArithmeticConfig warmup_task;
  size_t warmup_examples = 2000;
  /// The warm-up labels come from a weak teacher that drops each carry
  /// with this probability (0: exact labels); see
  /// ArithmeticTask::weak_teacher_answer.
  double warmup_carry_drop = 0.0;
  size_t warmup_steps = 300;
  size_t warmup_batch = 64;
  model::AdamWConfig warmup_optim;

  /// GRPO: each step samples `group_size` completions for each of
  /// `prompts_per_step` fresh prompts of `rl_task`, rewards them, and takes
  /// one policy-gradient step on the groups that are not all equal.
  tasks::ArithmeticConfig rl_task;
  size_t rl_steps = 100;
  size_t prompts_per_step = 16;
  size_t group_size = 8;
  model::SamplingParams sampling;  // seed and stop token are set per step
  model::PolicyLossConfig loss;
  model::AdamWConfig rl_optim;

  /// The baseline: `baseline_steps` more supervised steps on the warm-up
  /// set from the warm-up's end (0: none). A GRPO step samples and trains on
  /// prompts_per_step x group_size sequences, a supervised one on
  /// warmup_batch: compare at equal wall time (CurvePoint::seconds), not
  /// equal steps.
  size_t baseline_steps = 400;

  /// Evaluation: `eval_problems` held-out problems of `eval_task` from
  /// `eval_seed`, every `eval_every` steps of each phase.
  tasks::ArithmeticConfig eval_task;
  size_t eval_problems = 200;
  uint64_t eval_seed = 12345;
  size_t eval_every = 20;

  /// ok, or the first field out of range.
  Status validate() const;
};

/// One point of a curve.
struct CurvePoint {
  /// "warmup", "grpo" or "supervised" (the baseline).
  std::string phase;
  /// Steps taken in the phase.
  size_t step = 0;
  /// Wall seconds since the phase began (training and sampling; evaluation
  /// not counted).
  double seconds = 0;
  /// Held-out accuracy (exact answers, greedy).
  double accuracy = 0;
  /// Mean reward of the samples of the last step (grpo), or the last
  /// training loss (warmup, supervised).
  double train_signal = 0;
};

/// The whole run's curves.
struct LocalGrpoResult {
  std::vector<CurvePoint> curve;
  /// Accuracy at the warm-up's end, and at the end of each branch.
  double warmup_accuracy = 0, grpo_accuracy = 0, supervised_accuracy = 0;
};

/// The run docs/model.md reports, the README's main job shows and the
/// [learning] test asserts on: an L2 H4 C64 model, a warm-up of 2,000 steps
/// on 20,000 problems with 1-2 digit operands labelled by a teacher that
/// drops carries half the time, 100 GRPO steps of 32 prompts x 8 samples on
/// 2-digit operands, a 400-step supervised baseline, 400 held-out problems.
LocalGrpoConfig arithmetic_weak_teacher_run();

/// Runs the warm-up, then GRPO and the baseline from the same weights,
/// calling `progress` at each evaluation. Deterministic on a machine for a
/// config (seeded streams; BLAS's results may differ across machines).
Result<LocalGrpoResult> run_local_grpo(const LocalGrpoConfig& config,
                                       const std::function<void(const CurvePoint&)>& progress = {});

/// Greedy accuracy of `model` on `problems` (exact answers after the
/// prompt, ended by EOS).
Result<double> arithmetic_accuracy(const model::Gpt<float>& model, const std::vector<tasks::ArithmeticProblem>& problems);

}  // namespace troupe::rl::train
