// The configuration of an RL job (`troupe rl train CONFIG.toml`): one TOML
// file whose tables are the job's parts. Every key has a default; a key
// that is not known, or a value of the wrong type or out of range, is
// refused before anything starts, with the key named:
//
//   config.toml: unknown key 'rollout.enignes' (keys of [rollout]: engines, threads, ...)
//   config.toml: 'algorithm.group_size' must be an integer >= 2, got 1
//
// The reference of every key is docs/rl.md; examples/rl/ has a file per
// mode. The workers of a job get the file's text and parse it themselves,
// so the driver and every mesh see the same values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "model/adamw.h"
#include "model/config.h"
#include "model/device_model.h"
#include "model/losses.h"
#include "model/sampler.h"
#include "tasks/arithmetic.h"
#include "tasks/code.h"
#include "troupe/status.h"

namespace troupe::rl::config {

/// On-policy (each step trains on samples of the weights it starts from)
/// or asynchronous (rollout keeps generating while the trainer trains).
enum class Mode : uint8_t { sync, async };
/// Trainer and rollout in the same processes, taking turns, or in
/// processes of their own.
enum class Placement : uint8_t { colocated, disaggregated };
/// How advantages are made from rewards.
enum class Algorithm : uint8_t {
  /// Group-normalised advantages (no critic).
  grpo,
  /// RLOO: each sample's baseline is the mean of its group's others.
  rloo,
  /// PPO: a value head on the policy's trunk, GAE, a clipped value loss.
  ppo,
};
/// The task the job trains on (its prompts and its reward).
enum class TaskKind : uint8_t {
  arithmetic,
  code,
  /// A multi-turn environment (env/environment.h): running sums.
  running_sum,
};
/// Where the policy's first weights come from.
enum class ModelInit : uint8_t {
  /// Random (seeded): only useful with a task the model can already hit.
  random,
  /// A supervised warm-up on the trainer mesh first ([warmup]).
  warmup,
  /// A safetensors file (model.checkpoint).
  checkpoint,
};

/// [run]: the job as a whole.
struct RunConfig {
  std::string name = "rl";
  uint64_t seed = 1;
  /// Policy-gradient steps.
  size_t steps = 100;
  Mode mode = Mode::sync;
  Placement placement = Placement::colocated;
  /// Async mode: a sample may be trained on at most this many versions
  /// after the weights that started it (0 in sync mode).
  size_t max_staleness = 1;
  /// Held-out evaluation every this many steps (and at the end).
  size_t eval_every = 10;
  /// A checkpoint every this many steps (0: only at the end).
  size_t checkpoint_every = 0;
  /// The newest this many complete checkpoints are kept, older ones removed
  /// once a newer one is complete (0: every one kept).
  size_t keep_checkpoints = 0;
  /// Seconds an ask to a mesh may take before it counts as lost.
  double timeout_s = 120;
};

/// [task]: the prompts and the verifier.
struct TaskConfig {
  TaskKind kind = TaskKind::arithmetic;
  /// The RL prompts' operands (arithmetic).
  tasks::ArithmeticConfig problems{.min_digits = 2, .max_digits = 2};
  /// The functions to write (code): steps, constants, hidden tests.
  tasks::CodeConfig code;
  /// The model's turns per episode (multi-turn environments).
  size_t turns = 3;
  /// Held-out problems (greedy decoding, exact answers).
  size_t eval_problems = 400;
  uint64_t eval_seed = 12345;
};

/// [model]: the policy's shape and first weights.
struct ModelConfig {
  model::GptConfig shape{.vocab_size = 259, .context_length = 16, .layers = 2, .heads = 4, .channels = 64};
  ModelInit init = ModelInit::warmup;
  /// The safetensors file when init = "checkpoint".
  std::string checkpoint;
};

/// [warmup]: supervised steps on labelled problems before RL, on the
/// trainer mesh (init = "warmup").
struct WarmupConfig {
  size_t steps = 2000;
  /// Sequences per step (split across the trainer ranks).
  size_t batch = 64;
  /// Labelled problems drawn once (the set the steps sample from).
  size_t examples = 20000;
  tasks::ArithmeticConfig problems{.min_digits = 1, .max_digits = 2};
  /// The labels' teacher errs with this probability at each decision
  /// (arithmetic: drops a carry; code: drops a pair of parentheses).
  double teacher_error = 0.5;
  model::AdamWConfig optim{.learning_rate = 3e-3, .weight_decay = 0.1, .warmup_steps = 20};
};

/// [algorithm]: sampling, advantages, the loss and the optimizer.
struct AlgorithmConfig {
  Algorithm name = Algorithm::grpo;
  size_t prompts_per_step = 32;
  /// Samples per prompt (the group).
  size_t group_size = 8;
  /// GRPO: divide by the group's standard deviation (false: Dr. GRPO).
  bool normalize_std = true;
  /// Temperature, top_k, top_p, max_new_tokens (0: the task's answer
  /// budget); seeds and the stop token are the job's.
  model::SamplingParams sampling{.temperature = 1.0, .max_new_tokens = 0};
  model::PolicyLossConfig loss;
  model::AdamWConfig optim{.learning_rate = 3e-4, .weight_decay = 0.0};
  /// PPO: GAE's discount and lambda, the value loss's weight and clipping.
  double gamma = 1.0, lambda = 0.95;
  double value_coef = 0.5, value_clip = 0.2;
  /// Updates per step (veRL's ppo_epochs and ppo_mini_batch_size): the
  /// step's sequences are split into `mini_batches` parts, and the trainer
  /// takes one optimizer step on each, `epochs` times over. With more than
  /// one update, the later ones train on samples of older weights, which
  /// is what the clipped ratio bounds; PPO's critic keeps the values it
  /// gave before the first update (its old values).
  size_t epochs = 1, mini_batches = 1;
};

/// Where a mesh's model computes (trainer.device, rollout.device). `host`:
/// the device path on the CPU model (model::DeviceKind::host), the CPU's
/// steps bit for bit; it runs the GPU code paths where there is no GPU: a
/// trainer's state resident in the device model and the allreduce on its
/// gradients, an engine's decoder with weights of its own and a standby,
/// and the weight broadcast from one to the other (device_weight_broadcast).
enum class Device : uint8_t { cpu, cuda, host };

/// How new weights go from the trainer to the rollout engines.
enum class WeightSync : uint8_t {
  /// Each engine reads trainer rank 0's published buffer with one-sided
  /// reads, in buckets (the trainer's side does nothing).
  rma,
  /// Trainer rank 0 broadcasts the published buffer over a collective group
  /// of it and every engine (a tree: the root sends log2(engines + 1)
  /// times, not once per engine); an engine that misses it is synced by
  /// reads, and the group is made again once every engine is back.
  broadcast,
};

/// [trainer]: the data-parallel trainer mesh.
struct TrainerConfig {
  size_t ranks = 1;
  /// Compute threads per rank's process.
  size_t threads = 1;
  /// ZeRO-1: each rank keeps the AdamW moments of its shard of the
  /// parameters only (1/ranks of them): gradients are reduce-scattered,
  /// each rank updates its shard, and the ranks allgather the parameters.
  bool shard_optimizer = false;
  /// ZeRO-1: a lost rank is recovered in memory. After every update each
  /// rank snapshots its segment (parameters and moments) and the next rank
  /// backs it up, the last two of each kept: 12 x parameters / ranks more
  /// floats per rank, and the reference policy's copy. false: a lost rank
  /// sends the job back to its last checkpoint.
  bool shard_backup = true;
  /// Where each rank's forward and backward run: the CPU (its `threads`),
  /// or a CUDA GPU (model/device_model.h). On a GPU the parameters,
  /// gradients and AdamW's moments stay there between steps, the gradient
  /// allreduce is NCCL's on them, and the host gets the parameters for a
  /// weight sync or a checkpoint; with shard_optimizer (ZeRO-1) the
  /// optimizer and the collectives stay on the host. Rank r takes device
  /// r modulo the GPUs its process sees (its bundle's GPUs: the cluster
  /// narrows CUDA_VISIBLE_DEVICES to them). `host`: see Device.
  using Device = config::Device;
  Device device = Device::cpu;
  /// cuda: how the GPU multiplies matrices (float32, TF32 tensor cores,
  /// or bfloat16 products with float32 accumulation).
  model::MatmulPrecision precision = model::MatmulPrecision::fp32;
  /// cuda: GPUs each rank reserves in its placement group (below 1: ranks
  /// share a GPU).
  double gpus_per_rank = 1;
};

/// [rollout]: the generation engines.
struct RolloutConfig {
  size_t engines = 1;
  /// Compute threads per engine's process (colocated: the trainer's).
  size_t threads = 1;
  /// Sequences an engine decodes at once (its KV cache's slots).
  size_t max_sequences = 256;
  /// Prompt groups the driver keeps in flight per engine (continuous
  /// batching: new groups join between decode steps).
  size_t groups_in_flight = 8;
  /// A sequence's log-probabilities do not depend on what shares its
  /// decode steps (KvCache::set_batch_invariant): a seeded job gives the
  /// same bits every run, and a resumed one the steps it would have taken.
  /// Off: faster decoding on larger models, reproducible to ~1e-7.
  bool batch_invariant = true;
  /// Where each engine decodes: the CPU (its `threads`), or a CUDA GPU
  /// (make_device_decoder: the KV cache and the weights on the device,
  /// sampling on the host). cuda needs batch_invariant false: cuBLAS picks
  /// its reduction order by shape, so a row's last bits depend on its batch.
  /// `host`: see Device.
  Device device = Device::cpu;
  /// cuda: how the GPU multiplies matrices.
  model::MatmulPrecision precision = model::MatmulPrecision::fp32;
  /// cuda: GPUs each engine reserves in its placement group (below 1:
  /// engines share a GPU); colocated, a rank's process reserves the larger
  /// of this and trainer.gpus_per_rank.
  double gpus_per_engine = 1;
  /// Weight sync moves the parameters in buckets of this many bytes, this
  /// many reads in flight per engine.
  size_t sync_bucket_bytes = 4u << 20;
  size_t sync_reads_in_flight = 4;
  /// How the weights get to the engines (needs 'run.placement'
  /// "disaggregated" for broadcast).
  WeightSync weight_sync = WeightSync::rma;
};

/// [reward]: the reward workers.
struct RewardConfig {
  size_t workers = 1;
  /// Sandboxes a worker runs at once (code).
  size_t sandboxes = 2;
};

/// A whole job.
struct RlConfig {
  RunConfig run;
  TaskConfig task;
  ModelConfig model;
  WarmupConfig warmup;
  AlgorithmConfig algorithm;
  TrainerConfig trainer;
  RolloutConfig rollout;
  RewardConfig reward;

  /// Tokens a completion may take: max_new_tokens, or the task's answer
  /// budget when that is 0.
  size_t answer_budget() const;
  /// The sampling parameters of rollouts (the budget and EOS filled in).
  model::SamplingParams rollout_sampling() const;
  /// The trainer's model: the policy's shape, with a value head for PPO
  /// (the rollout engines hold the policy alone: the first
  /// ParamLayout::policy_count() parameters).
  model::GptConfig trainer_shape() const;

  /// ok, or the first value out of range (with its key) and the
  /// combinations that cannot work (a context too short for the task's
  /// problems, more trainer ranks than sequences per step).
  Status validate() const;
};

/// Parses a config from TOML text; `source` names it in errors (a path).
/// Errors: TOML syntax (with line and column), unknown keys and tables,
/// wrong types, values out of range: each names the key.
Result<RlConfig> parse_rl_config(std::string_view toml_text, std::string_view source = "config");

/// Reads and parses a config file. Errors: the file cannot be read (its
/// path and why), and parse_rl_config's.
Result<RlConfig> load_rl_config(const std::string& path);

/// For the job's actors, built from the config text the driver checked:
/// parses it, or throws (naming `who`) so that the actor fails to start; a
/// failure here means a worker runs another troupe than the driver.
RlConfig job_config_or_throw(const std::string& config_text, std::string_view who);

/// Whether a weight broadcast goes from trainer rank 0's device parameters
/// straight into each engine's decoder standby (NCCL between GPUs; the
/// host kind's collectives on its memory), nothing through the host: with
/// 'rollout.weight_sync' "broadcast", a trainer resident on a device (not
/// ZeRO-1, which keeps its parameters on the host) and engines on the same
/// kind of device. Otherwise the broadcast moves the published host copy.
bool device_weight_broadcast(const RlConfig& config);

/// The config as a JSON object (every key, defaults included), for the
/// run's metrics and manifest.
std::string rl_config_json(const RlConfig& config);

}  // namespace troupe::rl::config
