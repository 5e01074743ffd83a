// One data-parallel rank of the trainer mesh: a replica of the policy and
// its optimizer. A step gives each rank its share of the batch; each
// computes its gradient, the ranks sum them with the mesh's allreduce, and
// each applies the same sum, so the replicas stay identical (bit for bit:
// the same bytes in, the same operations). Rank 0 also publishes the
// weights for the rollout engines to read (a registered buffer: one-sided
// reads) and writes checkpoints.
//
// The rank is built from the job's config text (rl_config.h), which every
// process parses itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <troupe/collective_buffer.h>
#include <troupe/collective_group.h>
#include <troupe/remote_buffer.h>
#include <troupe/troupe.h>

#include "config/rl_config.h"
#include "model/gpt.h"
#include "train/policy_trainer.h"

namespace troupe::rl::trainer {

/// One sequence to train on, as it travels to a rank.
struct WireSequence {
  std::vector<int32_t> prompt;
  std::vector<int32_t> completion;
  /// The sampling policy's log-probability of each completion token (empty
  /// for supervised data).
  std::vector<float> logprobs;
  /// Its advantage (GRPO, RLOO), or its outcome reward (PPO: the rank
  /// makes per-token advantages with its critic).
  double advantage = 0;
  double reward = 0;
  /// Which completion tokens are the policy's (empty: all; see
  /// TrainSequence::completion_mask).
  std::vector<uint8_t> mask;
  /// PPO with several updates per step: the critic's value at each
  /// completion token before the step's first update (ScoreValues); empty:
  /// the training forward's own.
  std::vector<float> values;
  TROUPE_FIELDS(prompt, completion, logprobs, advantage, reward, mask, values);
};

/// ZeRO-1's in-memory recovery (trainer.shard_backup): a rank's segment of
/// the training state as it was after an optimizer step (its segment of
/// the parameters and the segment's AdamW moments), registered for other
/// ranks to read. Each rank snapshots its segment at the end of every
/// update (TrainStep::snapshot), and the driver has the next rank (rank + 1
/// mod ranks) back it up; each
/// keeps the last two of both. So a lost rank's segment is in memory on
/// its successor, and every rank can go back to the last committed step,
/// whichever part of a snapshot round a rank was lost in.
struct ShardSnapshot {
  RemoteBuffer params, m, v;
  /// The segment [begin, end) of the parameter buffer.
  uint64_t begin = 0, end = 0;
  uint64_t optimizer_steps = 0;
  bool rl_phase = false;
  /// The KL penalty's reference policy, whole (empty: none).
  RemoteBuffer reference;
  /// The model's parameters (the reference's floats).
  uint64_t floats = 0;
  TROUPE_FIELDS(params, m, v, begin, end, optimizer_steps, rl_phase, reference, floats);
};

/// What one rank's step did (its share; the driver combines the ranks').
struct RankStepStats {
  /// The rank's loss over its share (weight it by grad_scale to combine).
  double loss = 0;
  /// The global gradient norm (the same on every rank).
  double grad_norm = 0;
  double learning_rate = 0;
  uint64_t completion_tokens = 0;
  double clip_fraction = 0, ratio_mean = 0, kl = 0, entropy = 0;
  /// PPO's critic: its loss and explained variance.
  double value_loss = 0, explained_variance = 0;
  /// Seconds computing the gradient, and in the allreduce.
  double compute_seconds = 0, allreduce_seconds = 0;
  /// TrainStep::snapshot: the segment's snapshot after the update (one).
  std::vector<ShardSnapshot> snapshot;
  TROUPE_FIELDS(loss, grad_norm, learning_rate, completion_tokens, clip_fraction, ratio_mean, kl, entropy, value_loss,
                explained_variance, compute_seconds, allreduce_seconds, snapshot);
};

/// Joins the rank to its collective group (sent once per group).
struct JoinTrainerGroup {
  CollectiveGroup group;
  TROUPE_MESSAGE_NAMED(JoinTrainerGroup, "troupe.rl.JoinTrainerGroup", group);
};

/// One optimizer step on this rank's share of a batch: supervised
/// (next-token loss on the completions) or policy (the config's
/// policy-gradient loss with the sequences' advantages). `grad_scale` is
/// the rank's share of the loss's denominator (see PolicyTrainer). Every
/// rank of the group must get one, even with no sequences.
struct TrainStep {
  bool supervised = false;
  std::vector<WireSequence> sequences;
  double grad_scale = 1.0;
  /// The state the rank must be in (the driver's count of the phase's
  /// optimizer steps, and the phase): a rank that restarted since, and so
  /// lost its state, refuses the step instead of training from scratch
  /// beside the others.
  uint64_t expected_steps = 0;
  bool rl_phase = false;
  /// ZeRO-1 with shard_backup: once updated, snapshot the segment (what
  /// SnapshotShard does) and answer with it, saving the driver a round.
  bool snapshot = false;
  TROUPE_MESSAGE_NAMED(TrainStep, "troupe.rl.TrainStep", supervised, sequences, grad_scale, expected_steps, rl_phase,
                       snapshot);
};

/// PPO: the critic's value at each completion token of each sequence, with
/// the rank's current weights (no update). The reply holds one vector per
/// sequence, as long as its completion.
struct ScoreValues {
  std::vector<WireSequence> sequences;
  TROUPE_MESSAGE_NAMED(ScoreValues, "troupe.rl.ScoreValues", sequences);
};

/// The weights for readers elsewhere: a registered copy of the policy's
/// parameters (a PPO critic's head is not published), valid until the
/// next PublishWeights to this rank.
struct PublishedWeights {
  RemoteBuffer buffer;
  uint64_t version = 0;
  /// Floats in the buffer (the layout's total).
  uint64_t floats = 0;
  /// The publishing rank's process: a buffer whose publisher restarted is
  /// gone, and must be published again.
  int64_t publisher_pid = 0;
  /// A rank resident on a device: where the same parameters are there, for
  /// an engine on that device to copy device to device (its process, or
  /// another by CUDA IPC) instead of reading the buffer. Only until the
  /// rank's next step: the driver sends it with the sync that follows the
  /// publish and clears it from the copy it keeps for later syncs.
  model::SharedParams device;
  TROUPE_FIELDS(buffer, version, floats, publisher_pid, device);
};

/// Copies the parameters into the rank's published buffer as `version`.
struct PublishWeights {
  uint64_t version = 0;
  TROUPE_MESSAGE_NAMED(PublishWeights, "troupe.rl.PublishWeights", version);
};

/// rollout.weight_sync = "broadcast": makes trainer rank 0 (as rank 0) or
/// a rollout engine a member of the weight-sync group (trainer rank 0 and
/// every engine, troupe::make_group across the two meshes), in place of
/// any group before.
struct JoinWeightSyncGroup {
  CollectiveGroup group;
  TROUPE_MESSAGE_NAMED(JoinWeightSyncGroup, "troupe.rl.JoinWeightSyncGroup", group);
};

/// Publishes the parameters as `version` (what PublishWeights does), then
/// broadcasts the published buffer over the weight-sync group `group` (of
/// which this rank is rank 0, the root): each engine takes it with
/// rollout::ReceiveWeights. With config::device_weight_broadcast it
/// broadcasts the device's parameters instead (NCCL between GPUs); the
/// published copy remains for engines that miss it.
struct BroadcastWeights {
  uint64_t version = 0;
  std::string group;
  TROUPE_MESSAGE_NAMED(BroadcastWeights, "troupe.rl.BroadcastWeights", version, group);
};

/// What a BroadcastWeights did: the weights are published either way (for
/// one-sided reads, the fallback), and the broadcast either done on this
/// rank or failed (`failed` says why: an engine gone, the deadline, not in
/// that group).
struct WeightsBroadcast {
  PublishedWeights published;
  std::string failed;
  /// The broadcast's time on this rank.
  double seconds = 0;
  /// It sent the device's parameters (config::device_weight_broadcast),
  /// not the published host copy.
  bool from_device = false;
  /// The ErrorCode of `failed` (as an integer), when it failed.
  int32_t failed_code = 0;
  TROUPE_FIELDS(published, failed, seconds, from_device, failed_code);
};

/// Ends the warm-up: the current weights become the reference policy of
/// the KL penalty, and the RL phase's optimizer starts afresh.
struct StartRlPhase {
  TROUPE_MESSAGE_NAMED(StartRlPhase, "troupe.rl.StartRlPhase");
};

/// Writes the training state (weights, optimizer, its step) to `path`
/// (a safetensors file, atomically), with `metadata` beside it (keys not
/// starting with "troupe."). A failed write is the reply's error; the rank
/// goes on.
struct SaveTrainerState {
  std::string path;
  std::vector<std::pair<std::string, std::string>> metadata;
  /// Where the KL penalty's reference policy goes (a model file; empty:
  /// not saved).
  std::string reference_path;
  TROUPE_MESSAGE_NAMED(SaveTrainerState, "troupe.rl.SaveTrainerState", path, metadata, reference_path);
};

/// Reads a training state written by SaveTrainerState; replies with its
/// metadata. The reference policy comes from `reference_path` when that
/// file exists, else it is the loaded weights (a checkpoint without one).
struct LoadTrainerState {
  std::string path;
  std::string reference_path;
  TROUPE_MESSAGE_NAMED(LoadTrainerState, "troupe.rl.LoadTrainerState", path, reference_path);
};

/// The rank's whole state for another rank to copy (a rank that restarted
/// takes a survivor's instead of the last checkpoint's).
struct TrainerStateHandles {
  RemoteBuffer params, m, v;
  uint64_t optimizer_steps = 0;
  uint64_t floats = 0;
  /// The KL penalty's reference policy (empty: the rank has none).
  RemoteBuffer reference;
  TROUPE_FIELDS(params, m, v, optimizer_steps, floats, reference);
};
struct ExportTrainerState {
  TROUPE_MESSAGE_NAMED(ExportTrainerState, "troupe.rl.ExportTrainerState");
};
/// Copies another rank's state (one-sided reads); `rl_phase` says which
/// optimizer settings the state is for (a restarted rank starts in the
/// warm-up's).
struct ImportTrainerState {
  TrainerStateHandles from;
  bool rl_phase = true;
  TROUPE_MESSAGE_NAMED(ImportTrainerState, "troupe.rl.ImportTrainerState", from, rl_phase);
};

/// Where a shard snapshot is in the job: after `optimizer_steps` steps of
/// the warm-up or of the RL phase.
struct ShardVersion {
  uint64_t optimizer_steps = 0;
  bool rl_phase = false;
  bool operator==(const ShardVersion&) const = default;
  TROUPE_FIELDS(optimizer_steps, rl_phase);
};

/// Copies the rank's segment (and its reference policy) into its snapshot;
/// replies with it. Errors: not sharded, or no group yet.
struct SnapshotShard {
  TROUPE_MESSAGE_NAMED(SnapshotShard, "troupe.rl.SnapshotShard");
};
/// Reads `from` (the previous rank's snapshot) into this rank's backup of it.
struct BackUpShard {
  ShardSnapshot from;
  TROUPE_MESSAGE_NAMED(BackUpShard, "troupe.rl.BackUpShard", from);
};
/// The backup of the previous rank's segment at `version` this rank
/// holds. Errors: none at that version.
struct ExportBackup {
  ShardVersion version;
  TROUPE_MESSAGE_NAMED(ExportBackup, "troupe.rl.ExportBackup", version);
};
/// Puts the rank's segment back at `version`: from `from` (another rank's
/// backup of it, with the reference policy from `reference` when given),
/// or, when `from` is empty, from the rank's own state (nothing to do when
/// it is at `version`) or own snapshot at `version`. Then GatherParams
/// makes the whole parameter buffer again. Errors: no such snapshot, one of
/// another segment or model, a read that failed (nothing changed).
struct RestoreShard {
  ShardVersion version;
  ShardSnapshot from;
  RemoteBuffer reference;
  TROUPE_MESSAGE_NAMED(RestoreShard, "troupe.rl.RestoreShard", version, from, reference);
};
/// Allgathers the parameters over the rank's group (each rank's segment
/// to every rank): every rank of the group is sent one.
struct GatherParams {
  TROUPE_MESSAGE_NAMED(GatherParams, "troupe.rl.GatherParams");
};

/// Where a rank is and what it holds.
struct TrainerInfo {
  int64_t pid = 0;
  /// FNV-1a over the parameters' bytes: equal on every rank when the
  /// replicas agree.
  uint64_t checksum = 0;
  /// The state the rank is in: its phase's optimizer steps, and the phase.
  /// (Not ActorBase::restart_count(): a rank restarted into a new process
  /// is a new actor there, whose count starts again at 0.)
  uint64_t optimizer_steps = 0;
  bool rl_phase = false;
  /// Floats in each of the optimizer's moments: the model's parameters, or
  /// (ZeRO-1) this rank's segment of them.
  uint64_t optimizer_floats = 0;
  /// Where its forwards and backwards run: "cpu", or the device model's
  /// description ("cuda:0 NVIDIA H100 80GB HBM3, fp32 products").
  std::string device;
  /// ZeRO-1 in memory: the versions of the rank's snapshots of its
  /// segment and of its backups of the previous rank's (up to two each).
  std::vector<ShardVersion> snapshots, backups;
  TROUPE_FIELDS(pid, checksum, optimizer_steps, rl_phase, optimizer_floats, device, snapshots, backups);
};
struct GetTrainerInfo {
  TROUPE_MESSAGE_NAMED(GetTrainerInfo, "troupe.rl.GetTrainerInfo");
};

/// The actor.
class TrainerRank : public Actor<TrainerRank, JoinTrainerGroup, TrainStep, ScoreValues, PublishWeights, StartRlPhase,
                                 SaveTrainerState, LoadTrainerState, ExportTrainerState, ImportTrainerState,
                                 GetTrainerInfo, SnapshotShard, BackUpShard, ExportBackup, RestoreShard,
                                 GatherParams, JoinWeightSyncGroup, BroadcastWeights> {
 public:
  /// A rank of the job configured by `config_toml` (rl_config.h); its
  /// weights are the config's init (random or a checkpoint; a warm-up is
  /// trained through TrainStep). Its rank is its group's (JoinTrainerGroup).
  explicit TrainerRank(std::string config_toml);

  void handle(const JoinTrainerGroup& m);
  Deferred<RankStepStats> handle(const TrainStep& m);
  Result<std::vector<std::vector<float>>> handle(const ScoreValues& m);
  PublishedWeights handle(const PublishWeights& m);
  void handle(const JoinWeightSyncGroup& m);
  Deferred<WeightsBroadcast> handle(const BroadcastWeights& m);
  void handle(const StartRlPhase& m);
  Deferred<void> handle(const SaveTrainerState& m);
  Deferred<std::vector<std::pair<std::string, std::string>>> handle(const LoadTrainerState& m);
  Result<TrainerStateHandles> handle(const ExportTrainerState& m);
  Deferred<uint64_t> handle(const ImportTrainerState& m);
  TrainerInfo handle(const GetTrainerInfo& m);
  Result<ShardSnapshot> handle(const SnapshotShard& m);
  Deferred<void> handle(const BackUpShard& m);
  Result<ShardSnapshot> handle(const ExportBackup& m);
  Deferred<void> handle(const RestoreShard& m);
  Deferred<void> handle(const GatherParams& m);

 private:
  config::RlConfig config_;
  // trainer.device = "cuda": where the policy's and the reference's
  // forwards and backwards run (the trainer holds device_ by pointer).
  std::unique_ptr<model::DeviceModel> device_, reference_device_;
  std::optional<train::PolicyTrainer> trainer_;
  std::optional<model::Gpt<float>> reference_;
  // Whether reference_device_ holds reference_'s weights (false whenever
  // reference_ changes).
  bool reference_on_device_ = false;
  std::optional<CollectiveGroup> group_;
  // rollout.weight_sync = "broadcast" (rank 0): the group it broadcasts
  // the published weights over.
  std::optional<CollectiveGroup> sync_group_;
  // The published copy of the parameters, and the exported state.
  // The published copy. rollout.weight_sync = "broadcast": in a
  // CollectiveBuffer, which a broadcast's ranks on this host read in place
  // (one copy each) instead of through the group's arena (two); "rma": in
  // the transport's own memory (allocate_buffer), which its readers on
  // this host map and copy from directly, while reads of memory registered
  // in place go through the kernel (CMA: 3x slower with 4 readers at
  // once). The memory outlives its registration (declared first).
  CollectiveBuffer published_memory_;
  BufferRegistration published_;
  BufferRegistration exported_params_, exported_m_, exported_v_, exported_reference_;
  std::vector<float> ref_logprobs_;
  // Past the warm-up (StartRlPhase, a resume, or a copied RL-phase state).
  bool rl_phase_ = false;
  // ZeRO-1 (trainer.shard_optimizer, 2+ ranks): this rank's segment of the
  // parameters, whose optimizer state it keeps; set when it joins a group.
  std::optional<model::ParamRange> shard_;
  // Each rank's squared gradient norm (a sharded step's allgather).
  std::vector<double> norm_parts_;
  // ZeRO-1 in memory: this rank's snapshot of its segment, and its backup
  // of the previous rank's (the handles in each point at the registrations).
  struct ShardRegistrations {
    BufferRegistration params, m, v;
  };
  struct ShardCopy {
    // Shared with the reads that fill a backup, which keep it alive.
    std::shared_ptr<ShardRegistrations> regs = std::make_shared<ShardRegistrations>();
    std::optional<ShardSnapshot> meta;  // handles at the registrations
  };
  // ZeRO-1 in memory: the last two snapshots of this rank's segment and
  // backups of the previous rank's (the next write goes to [next_]), and
  // the reference policy the snapshots point at.
  ShardCopy snaps_[2], backups_[2];
  size_t next_snap_ = 0, next_backup_ = 0;
  bool backup_reading_ = false;
  BufferRegistration snap_reference_;

  // (Re)makes the trainer of `weights` with `optim`, this rank's shard
  // and device.
  void make_trainer(model::Gpt<float> weights, const model::AdamWConfig& optim);
  // Floats in each of the optimizer's moments (TrainerInfo::optimizer_floats).
  size_t optimizer_floats() const;
  // The kind of device model trainer.device asks for (not "cpu").
  model::DeviceKind device_kind() const;
  // The device model for this rank (trainer.device "cuda" or "host"; null on the CPU).
  std::unique_ptr<model::DeviceModel> make_device(size_t rank) const;
  // The reference policy's log-probabilities of `batch` into ref_logprobs_.
  Status reference_logprobs(const train::TrainBatch& batch);
  // Writes the reference policy to `path` (nothing when the path is empty
  // or the job has no KL penalty).
  Status save_reference(const std::string& path);
  // The optimizer settings of the phase the rank is in.
  model::AdamWConfig optim_now() const;
  // Runs a collective of the rank's group on `data` in place; `then` gets
  // its outcome (an error names `what` and the rank).
  void collective(CollectiveKind kind, void* data, size_t count, DType dtype, const char* what,
                  std::function<void(Status)> then);
  // Copies `floats` floats into `reg`, (re)registering it at that size
  // (only the registration when `src` is null).
  Status registered_copy(BufferRegistration& reg, const float* src, size_t floats);
  // Copies a segment into `c` (its registrations), with `meta` for it.
  Status store_copy(ShardCopy& c, const ShardSnapshot& meta, const float* params, const float* m, const float* v);
  // Sets the rank's segment, its moments and steps, its phase (and the
  // reference policy, when given) from a snapshot `at`.
  void restore_shard(const ShardSnapshot& at, const float* params, std::vector<float> m, std::vector<float> v,
                     const std::vector<float>* reference);
  // The rest of a TrainStep under ZeRO-1, from the gradients on.
  /// Copies the segment (and the reference policy) into the next snapshot
  /// generation: SnapshotShard, and TrainStep::snapshot.
  Result<ShardSnapshot> take_snapshot();
  void sharded_step(Deferred<RankStepStats> reply, RankStepStats out, train::StepStats st, bool snapshot,
                    std::chrono::steady_clock::time_point reduce_start);
};

}  // namespace troupe::rl::trainer
